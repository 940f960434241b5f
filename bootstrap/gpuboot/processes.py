"""The processes of a run, found by a mark in their environment.

Every ansible-playbook gpuboot starts carries GPUBOOT_RUN_DIR=<the run's directory>, and so
does every worker it forks and every command a worker runs. Ansible's workers start sessions
of their own, so neither ansible-playbook's process group nor its parentage holds them once
it is gone: after a cancel, or after gpuboot itself was killed (SIGKILL), they are found by
the mark and stopped. ssh's ControlPersist masters carry the mark too but are left alone:
they serve the next phase and exit on their own when idle."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

RUN_MARK = "GPUBOOT_RUN_DIR"
PROC = Path("/proc")


def _environ(pid: str) -> list[bytes]:
    try:
        return (PROC / pid / "environ").read_bytes().split(b"\0")
    except OSError:  # gone, or a zombie, or not ours to read
        return []


def _is_ssh_master(pid: str) -> bool:
    try:
        cmdline = (PROC / pid / "cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.startswith(b"ssh: ") and b"[mux]" in cmdline


def marked(prefix: str | Path) -> list[int]:
    """Live processes whose run directory lies under `prefix` (a run's or a state directory)."""
    want = f"{RUN_MARK}={prefix}".encode()
    own = str(os.getpid())
    found = []
    for entry in PROC.iterdir():
        pid = entry.name
        if not pid.isdigit() or pid == own:
            continue
        if any(var == want or var.startswith(want + b"/") for var in _environ(pid)) and not _is_ssh_master(pid):
            found.append(int(pid))
    return sorted(found)


def run_of(pid: int, runs: Path) -> str | None:
    """The run (its directory's name under `runs`) a marked process belongs to."""
    prefix = f"{RUN_MARK}={runs}/".encode()
    for var in _environ(str(pid)):
        if var.startswith(prefix):
            return var[len(prefix):].decode(errors="replace").split("/", 1)[0]
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purpose: it runs nothing
        return (PROC / str(pid) / "stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def stop(pids: list[int], grace: float = 5.0) -> list[int]:
    """SIGTERM the process groups of `pids` (a worker's group holds the commands it runs),
    then SIGKILL what is still there after `grace` seconds. Returns the pids that were alive."""
    alive = [p for p in pids if _alive(p)]
    own = os.getpgrp()
    groups = set()
    for pid in alive:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    groups.discard(own)

    def signal_all(sig: int) -> None:
        for group in groups:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in alive:  # one that left its group (setsid) still gets the signal
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in alive):
        time.sleep(0.1)
    if any(_alive(p) for p in alive):
        signal_all(signal.SIGKILL)
    return alive
