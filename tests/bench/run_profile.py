"""Where a gpuboot run's wall time went, from the ansible-runner events it kept.

    python -m tests.bench.run_profile RUN_DIR [--top 25] [--host NAME]

RUN_DIR is one run's folder (`<state>/<cluster>/runs/<run id>`, the one its gpuboot.log is in).
Per phase: its wall time. Then the tasks that held the run longest: a task's wall is from its
start to the start of the next task of the same playbook (the linear strategy waits for every
host), with the slowest host's own duration beside it. With --host, that host's own task
durations instead, which is where a serial play (an upgrade, node by node) spends its time."""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

HOST_DONE = {"runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable"}


class TaskWall(NamedTuple):
    phase: str
    task: str
    wall: float
    slowest_host: str
    slowest: float


def _events(playbook_dir: Path) -> list[dict]:
    files = sorted((playbook_dir / "job_events").glob("*.json"), key=lambda p: int(p.name.split("-", 1)[0]))
    return [json.loads(f.read_text()) for f in files]


def _at(event: dict) -> float:
    return datetime.fromisoformat(event["created"]).timestamp()


def phase_walls(run_dir: Path) -> dict[str, float]:
    walls = {}
    for playbook_dir in sorted(p for p in (run_dir / "phases").iterdir() if p.is_dir()):
        events = _events(playbook_dir)
        if events:
            walls[playbook_dir.name] = _at(events[-1]) - _at(events[0])
    return walls


def task_walls(run_dir: Path) -> list[TaskWall]:
    out = []
    for playbook_dir in sorted(p for p in (run_dir / "phases").iterdir() if p.is_dir()):
        events = _events(playbook_dir)
        starts = [(i, e) for i, e in enumerate(events) if e["event"] == "playbook_on_task_start"]
        for n, (i, start) in enumerate(starts):
            end_index = starts[n + 1][0] if n + 1 < len(starts) else len(events) - 1
            hosts = [e["event_data"] for e in events[i:end_index + 1] if e["event"] in HOST_DONE]
            slowest = max(hosts, key=lambda d: d.get("duration") or 0, default={})
            out.append(TaskWall(playbook_dir.name, start["event_data"].get("task", "?"),
                                _at(events[end_index]) - _at(start), slowest.get("host", "-"),
                                slowest.get("duration") or 0.0))
    return out


def host_tasks(run_dir: Path, host: str) -> list[tuple[str, str, float]]:
    out = []
    for playbook_dir in sorted(p for p in (run_dir / "phases").iterdir() if p.is_dir()):
        for e in _events(playbook_dir):
            data = e.get("event_data", {})
            if e["event"] in HOST_DONE and data.get("host") == host:
                out.append((playbook_dir.name, data.get("task", "?"), data.get("duration") or 0.0))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--host")
    args = parser.parse_args(argv)
    if not (args.run_dir / "phases").is_dir():
        parser.error(f"{args.run_dir} has no phases/ folder: give a run's folder (<state>/<cluster>/runs/<run id>)")
    walls = phase_walls(args.run_dir)
    print(f"{'phase':32} {'wall s':>8}")
    for phase, wall in walls.items():
        print(f"{phase:32} {wall:8.1f}")
    print(f"{'all phases':32} {sum(walls.values()):8.1f}\n")
    if args.host:
        rows = sorted(host_tasks(args.run_dir, args.host), key=lambda r: -r[2])[:args.top]
        by_phase: dict[str, float] = defaultdict(float)
        for phase, _, duration in host_tasks(args.run_dir, args.host):
            by_phase[phase] += duration
        print(f"{args.host}: {sum(by_phase.values()):.1f} s in its own tasks")
        for phase, task, duration in rows:
            print(f"{duration:8.1f}  {phase:24} {task}")
        return
    print(f"{'wall s':>8} {'slowest host':>22}  phase / task")
    for t in sorted(task_walls(args.run_dir), key=lambda t: -t.wall)[:args.top]:
        print(f"{t.wall:8.1f} {t.slowest_host:>14} {t.slowest:6.1f}  {t.phase} / {t.task}")


if __name__ == "__main__":
    main()
