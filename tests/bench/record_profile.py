"""Where a recorded cluster module's time went, run by run, from what `.ci/record` keeps.

    python -m tests.bench.record_profile [LOG_DIR] [--top 3]

LOG_DIR is `.ci/record`'s log folder (default: ${TMPDIR:-/tmp}/gpuboot-record-logs): one
`<module>.log` (pytest's output, with --durations) and one `<module>-runs/` (the module's gpuboot
runs) per module. Per module: its pytest wall time, then each gpuboot run in the order it started
with its wall time, the phases it ran and the slowest of them, and at the end how much of the
module was gpuboot runs and how much the tests' own setup and waits. The share that is
`gpuboot up` of a fresh cluster is what a saved, built cluster would take off; the rest is what
the module's own checks cost. `python -m tests.bench.run_profile RUN_DIR` then breaks one run
down by task."""
from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

PYTEST_WALL = re.compile(r" in ([0-9.]+)s(?: \(\d+:\d\d:\d\d\))?\s*=*\s*$")
LINE = re.compile(r"^(\d\d:\d\d:\d\d) (\w+) (.*)$")


@dataclass
class Run:
    run_id: str
    started: datetime
    wall: float
    phases: dict[str, float] = field(default_factory=dict)
    requested: list[str] = field(default_factory=list)
    status: str = ""


def read_run(log: Path) -> Run | None:
    """One run from its gpuboot.log: None for a log without its RunStarted line."""
    run = None
    first = last = None
    for line in log.read_text(errors="replace").splitlines():
        match = LINE.match(line)
        if not match:
            continue
        stamp, kind, body = match.groups()
        at = datetime.strptime(stamp, "%H:%M:%S")
        first = first or at
        last = at
        if kind == "RunStarted":
            data = json.loads(body)
            run = Run(data["run_id"], datetime.strptime(data["run_id"][:15], "%Y%m%dT%H%M%S"), 0.0,
                      requested=list(data.get("phases", [])))
        elif kind == "PhaseFinished" and run is not None:
            data = json.loads(body)
            run.phases[data["phase"]] = run.phases.get(data["phase"], 0.0) + float(data["seconds"])
        elif kind == "RunFinished" and run is not None:
            run.status = json.loads(body).get("status", "")
    if run is None:
        return None
    span = (last - first) if last and first else timedelta(0)
    if span < timedelta(0):  # the run crossed midnight
        span += timedelta(days=1)
    run.wall = span.total_seconds()
    return run


def module_wall(pytest_log: Path) -> float | None:
    """pytest's own total from its summary line ("6 passed ... in 2740.92s (0:45:40)")."""
    if not pytest_log.is_file():
        return None
    for line in reversed(pytest_log.read_text(errors="replace").splitlines()):
        match = PYTEST_WALL.search(line)
        if match:
            return float(match.group(1))
    return None


def modules(log_dir: Path) -> dict[str, list[Run]]:
    found = {}
    for runs_dir in sorted(log_dir.glob("*-runs")):
        runs = [r for r in (read_run(p) for p in runs_dir.rglob("gpuboot.log")) if r is not None]
        found[runs_dir.name.removesuffix("-runs")] = sorted(runs, key=lambda r: (r.started, r.run_id))
    return found


def report(log_dir: Path, top: int = 3) -> str:
    out = []
    for name, runs in modules(log_dir).items():
        wall = module_wall(log_dir / f"{name}.log")
        in_runs = sum(r.wall for r in runs)
        out.append(f"{name}: {_minutes(wall) if wall is not None else 'pytest wall unknown'}, "
                   f"{len(runs)} gpuboot runs")
        for r in runs:
            slowest = sorted(r.phases.items(), key=lambda item: -item[1])[:top]
            phases = ", ".join(f"{p} {s:.0f} s" for p, s in slowest) or "no phase finished"
            out.append(f"  {r.started:%H:%M:%S} {r.run_id}  {r.wall:6.0f} s  {r.status or 'no end':<7} "
                       f"{len(r.requested)} phases; slowest: {phases}")
        if wall:
            out.append(f"  in gpuboot runs {_minutes(in_runs)} ({100 * in_runs / wall:.0f} %), "
                       f"the tests' own setup, checks and waits {_minutes(max(wall - in_runs, 0))}")
        out.append("")
    return "\n".join(out) if out else f"no <module>-runs folder under {log_dir}"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log_dir", nargs="?", type=Path,
                        default=Path(os.environ.get("TMPDIR", "/tmp")) / "gpuboot-record-logs")
    parser.add_argument("--top", type=int, default=3, help="the slowest phases shown per run")
    args = parser.parse_args()
    print(report(args.log_dir, args.top))


if __name__ == "__main__":
    main()
