"""Typed events: what the terminal, the JSON output and the run log are drawn from."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

HostStatus = Literal["ok", "changed", "failed", "unreachable", "skipped", "ignored"]


@dataclass(frozen=True)
class Event:
    @property
    def kind(self) -> str:
        return type(self).__name__

    def to_dict(self) -> dict:
        return {"event": self.kind, **asdict(self)}


@dataclass(frozen=True)
class RunStarted(Event):
    run_id: str
    cluster: str
    phases: list[str]
    log: str


@dataclass(frozen=True)
class ProcessesStopped(Event):
    """Processes an earlier run left behind (gpuboot was killed, its ansible-playbook and
    workers were not), stopped before this run touches a host."""
    pids: list[int]
    runs: list[str]


@dataclass(frozen=True)
class PhaseStarted(Event):
    phase: str
    title: str
    hosts: list[str]
    index: int
    total: int
    reason: str = ""  # why it runs (what a host no longer shows, changed inputs, ...)


@dataclass(frozen=True)
class PhaseSkipped(Event):
    phase: str
    reason: str


@dataclass(frozen=True)
class PlayStarted(Event):
    play: str


@dataclass(frozen=True)
class TaskStarted(Event):
    task: str


@dataclass(frozen=True)
class HostResult(Event):
    host: str
    task: str
    status: HostStatus
    message: str = ""
    data: Any = None


@dataclass(frozen=True)
class HostCounts:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    ignored: int = 0


@dataclass(frozen=True)
class PlaybookStats(Event):
    hosts: dict[str, HostCounts] = field(default_factory=dict)


@dataclass(frozen=True)
class PhaseFinished(Event):
    phase: str
    status: Literal["ok", "failed", "interrupted"]
    changed: int
    failed_hosts: list[str]
    seconds: float


@dataclass(frozen=True)
class Failure:
    host: str
    task: str
    message: str


@dataclass(frozen=True)
class RunFinished(Event):
    run_id: str
    status: Literal["ok", "failed", "interrupted"]
    phases_run: list[str]
    failures: list[Failure]
    log: str
    resume: str | None
    seconds: float
