"""Stopping a process the lab started, by the PID it recorded."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def stop_own_process(pid: int | None, program: bytes) -> None:
    """SIGTERM, then SIGKILL after 5 s, and only if that PID still runs `program`: a PID
    recorded by an earlier run may belong to something else by now."""
    if not pid:
        return
    try:
        if program not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
    except OSError:
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
