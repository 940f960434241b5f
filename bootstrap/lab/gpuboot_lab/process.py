"""Stopping a process the lab started, by the PID it recorded."""
from __future__ import annotations

import os
import re
import signal
import subprocess
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


_LISTENER = re.compile(r"^\S+\s+\d+\s+\d+\s+(\S+):\d+\s.*?users:\((.*)\)\s*$")


def listeners_on(address: str) -> set[int]:
    """PIDs of the processes listening on ADDRESS (any port), from `ss`."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=False).stdout
    pids: set[int] = set()
    for line in out.splitlines():
        match = _LISTENER.match(line)
        if match and match.group(1).strip("[]") == address:
            pids |= {int(pid) for pid in re.findall(r"pid=(\d+)", match.group(2))}
    return pids


def process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
