"""Draws typed events on the terminal (rich), or prints them as JSON lines."""
from __future__ import annotations

import json
import sys
from collections import Counter
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from gpuboot import events as ev

STYLE = {"ok": "green", "changed": "yellow", "failed": "red", "unreachable": "magenta", "interrupted": "red"}


class JsonLines:
    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout

    def __call__(self, event: ev.Event) -> None:
        self.stream.write(json.dumps(event.to_dict(), default=str) + "\n")
        self.stream.flush()


class ConsoleProgress:
    """Phase header, a live line with the current task and per-host counts, a phase bar,
    and one summary at the end that says what to do next."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=False, highlight=False, soft_wrap=True)
        self.progress: Progress | None = None
        self.bar = None
        self.counts: Counter[str] = Counter()
        self.task = ""
        self.phase = ""

    def _line(self) -> str:
        c = self.counts
        parts = [f"[green]ok {c['ok']}[/]", f"[yellow]changed {c['changed']}[/]"]
        if c["failed"]:
            parts.append(f"[red]failed {c['failed']}[/]")
        if c["unreachable"]:
            parts.append(f"[magenta]unreachable {c['unreachable']}[/]")
        return f"{self.phase}: {self.task[:60]}  " + " ".join(parts)

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, ev.RunStarted):
            self.console.print(f"[bold]gpuboot[/] cluster [bold]{event.cluster}[/] run {event.run_id}")
            self.console.print(f"  log: {event.log}")
            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(), console=self.console,
                                     transient=True)
            self.progress.start()
            self.bar = self.progress.add_task("starting", total=len(event.phases))
        elif isinstance(event, ev.ProcessesStopped):
            self.console.print(f"[yellow]stopped {len(event.pids)} processes left by the killed run "
                               f"{', '.join(event.runs) or '?'}[/] (pids {', '.join(map(str, event.pids))})")
        elif isinstance(event, ev.PhaseStarted):
            self.phase, self.task, self.counts = event.phase, "", Counter()
            because = f" [dim]— {escape(event.reason)}[/]" if event.reason else ""
            self.console.print(f"[bold][{event.index}/{event.total}] {event.title}[/] ({event.phase}) "
                               f"on {len(event.hosts)} hosts{because}", markup=True)
            self._update()
        elif isinstance(event, ev.TaskStarted):
            self.task = event.task
            self._update()
        elif isinstance(event, ev.HostResult):
            self.counts[event.status] += 1
            if event.status in ("failed", "unreachable"):
                self.console.print(f"  [{STYLE[event.status]}]{event.status}[/] {escape(event.host)} | "
                                   f"{escape(event.task)}: {escape(event.message)}")
            elif event.message:
                self.console.print(f"  [cyan]notice[/] {escape(event.host)} | {escape(event.message)}")
            self._update()
        elif isinstance(event, ev.PlaybookStats):
            totals: Counter[str] = Counter()
            for counts in event.hosts.values():
                totals.update({k: v for k, v in vars(counts).items()})
            bad = [h for h, c in event.hosts.items() if c.failed or c.unreachable]
            self.console.print(f"  {len(event.hosts)} hosts: ok={totals['ok']} changed={totals['changed']} "
                               f"failed={totals['failed']} unreachable={totals['unreachable']} "
                               f"skipped={totals['skipped']}" + (f"  [red]failing: {', '.join(bad)}[/]" if bad else ""))
        elif isinstance(event, ev.PhaseSkipped):
            self.console.print(f"[dim]skip {event.phase}: {escape(event.reason)}[/]")
            self._advance()
        elif isinstance(event, ev.PhaseFinished):
            style = STYLE.get(event.status, "white")
            self.console.print(f"  [{style}]{event.status}[/] {event.phase} in {event.seconds:.1f}s, "
                               f"{event.changed} changed")
            self._advance()
        elif isinstance(event, ev.RunFinished):
            if self.progress is not None:
                self.progress.stop()
            self._summary(event)

    def _update(self) -> None:
        if self.progress is not None and self.bar is not None:
            self.progress.update(self.bar, description=self._line())

    def _advance(self) -> None:
        if self.progress is not None and self.bar is not None:
            self.progress.advance(self.bar)

    def _summary(self, event: ev.RunFinished) -> None:
        style = STYLE.get(event.status, "white")
        self.console.print(f"[bold {style}]{event.status.upper()}[/] run {event.run_id} "
                           f"({len(event.phases_run)} phases run, {event.seconds:.1f}s)")
        by_task: dict[tuple[str, str], list[str]] = {}
        for failure in event.failures:
            by_task.setdefault((failure.task, failure.message), []).append(failure.host)
        for (task, message), hosts in by_task.items():
            self.console.print(f"  [red]{escape(task)}[/] on {escape(', '.join(sorted(set(hosts))))}")
            if message:
                self.console.print(f"    {escape(message)}")
        self.console.print(f"  log: {event.log}")
        if event.resume:
            self.console.print(f"  resume: [bold]{event.resume}[/]")
