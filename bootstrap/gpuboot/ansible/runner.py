"""The only module that imports ansible_runner.

A PlaybookRun is data: the inventory path and extravars are passed as such (never as
`-e key=value` strings), env files are suppressed so nothing secret is written beside
the artifacts, and every runner event is translated into a typed event."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ansible_runner

from gpuboot.ansible.translate import translate
from gpuboot.events import Event, PlaybookStats


@dataclass(frozen=True)
class PlaybookRun:
    playbook: Path
    inventory: Path
    artifact_dir: Path
    ident: str
    extravars: dict = field(default_factory=dict)
    envvars: dict = field(default_factory=dict)
    limit: str | None = None
    tags: tuple[str, ...] = ()
    forks: int = 5
    check: bool = False
    diff: bool = False
    verbosity: int = 0


@dataclass(frozen=True)
class PlaybookResult:
    status: str  # successful, failed, canceled, timeout
    rc: int
    stats: PlaybookStats | None
    stdout_path: Path

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0


def run_playbook(request: PlaybookRun, on_event: Callable[[Event], None],
                 cancel: threading.Event | None = None) -> PlaybookResult:
    request.artifact_dir.mkdir(parents=True, exist_ok=True)
    stats: list[PlaybookStats] = []

    def handle(raw: dict) -> bool:
        event = translate(raw)
        if isinstance(event, PlaybookStats):
            stats.append(event)
        if event is not None:
            on_event(event)
        return True  # let runner keep its own event files for the record

    flags = [flag for flag, on in (("--check", request.check), ("--diff", request.diff)) if on]
    runner = ansible_runner.run(
        private_data_dir=str(request.artifact_dir),
        artifact_dir=str(request.artifact_dir),
        ident=request.ident,
        playbook=str(request.playbook),
        inventory=str(request.inventory),
        extravars=dict(request.extravars),
        envvars=dict(request.envvars),
        limit=request.limit,
        tags=",".join(request.tags) or None,
        forks=request.forks,
        cmdline=" ".join(flags) or None,
        verbosity=request.verbosity,
        suppress_env_files=True,
        quiet=True,
        event_handler=handle,
        cancel_callback=(lambda: cancel.is_set()) if cancel is not None else None,
    )
    return PlaybookResult(
        status=str(runner.status),
        rc=int(runner.rc if runner.rc is not None else 1),
        stats=stats[-1] if stats else None,
        stdout_path=request.artifact_dir / request.ident / "stdout",
    )
