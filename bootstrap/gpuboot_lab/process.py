"""Stopping a process the lab started, by the PID it recorded."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def runs(pid: int | None, program: bytes) -> bool:
    """Whether that PID still runs `program` (a recorded PID may belong to something else by now)."""
    try:
        return bool(pid) and program in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_own_process(pid: int | None, program: bytes, group: bool = False) -> bool:
    """SIGTERM, then SIGKILL after 5 s, and only if that PID still runs `program`; with
    `group`, its whole process group (a process started in its own session). Returns
    whether there was something to stop."""
    if not runs(pid, program):
        return False
    kill = os.killpg if group else os.kill
    kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.1)
    kill(pid, signal.SIGKILL)
    return True
