"""What the test suite costs, module by module: wall time and this machine's CPU time.

A pytest plugin that CI loads (`-p tests.bench.suite_profile`). The CPU figure is the whole
machine's (/proc/stat), not pytest's own: a lab module's cost is mostly in its nodes'
processes (kubelet, etcd, the API servers, sshd, Ansible's forks), which are not pytest's
children. It is exact only while one module runs at a time: with .ci/run's lanes each lane's
figure also holds what the other lanes ran meanwhile (the wall times stay each module's own).

At the end it prints the costliest modules and writes every module's figures, with the commit
and the machine, to ~/.cache/gpuboot/suite-profile/<time>-<commit>[-lane<N>].json. A module whose every
test was skipped as REUSED shows as reused: its cost there is the check, not the test.

    .venv/bin/python -m tests.bench.suite_profile FILE.json   # the table again from a record
    .venv/bin/python -m tests.bench.suite_profile --row LANE0.json LANE1.json
        # one run's row for docs/benchmarks.md's `.ci/run` table, from its lanes' records
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHOWN = 20


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuboot" / "suite-profile"


def busy_seconds(stat: str | None = None) -> float:
    """CPU-seconds every core of this machine spent not idle since boot (/proc/stat's first line)."""
    line = (stat if stat is not None else Path("/proc/stat").read_text()).splitlines()[0].split()
    assert line[0] == "cpu", line
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in (line[1:9] + ["0"] * 8)[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass
class ModuleCost:
    module: str
    wall: float = 0.0
    cpu: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def reused(self) -> bool:
        return set(self.outcomes) == {"reused"}

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def outcome_of(report) -> str | None:
    """A test's outcome once per test: its call's, or its setup's when setup failed or skipped
    (a skip as REUSED happens there), or its teardown's when only teardown failed."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if report.skipped:
            return "reused" if "REUSED" in str(report.longrepr) else "skipped"
        return report.outcome
    if report.when == "teardown" and report.failed:
        return "failed"
    return None


class SuiteProfile:
    def __init__(self, clock=time.monotonic, cpu=busy_seconds):
        self.clock, self.cpu = clock, cpu
        self.modules: dict[str, ModuleCost] = {}
        self._open: tuple[str, float, float] | None = None

    def _module(self, nodeid: str) -> ModuleCost:
        name = nodeid.split("::", 1)[0]
        return self.modules.setdefault(name, ModuleCost(name))

    def start(self, nodeid: str) -> None:
        self._open = (nodeid, self.clock(), self.cpu())

    def finish(self) -> None:
        if self._open is None:
            return
        nodeid, t0, c0 = self._open
        cost = self._module(nodeid)
        cost.wall += self.clock() - t0
        cost.cpu += self.cpu() - c0
        self._open = None

    def report(self, report) -> None:
        outcome = outcome_of(report)
        if outcome:
            self._module(report.nodeid).count(outcome)

    def record(self, commit: str, cores: int) -> dict:
        return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit, "cores": cores,
                "modules": [asdict(m) for m in sorted(self.modules.values(), key=lambda m: -m.wall)]}


def table(record: dict, shown: int = SHOWN) -> list[str]:
    modules = [ModuleCost(**m) for m in record["modules"]]
    wall, cpu, cores = sum(m.wall for m in modules), sum(m.cpu for m in modules), record["cores"]
    lines = [f"suite cost at {record['commit']} on {cores} cores: {wall / 60:.1f} min wall, "
             f"{cpu / 60:.1f} core-min of CPU ({100 * cpu / (wall * cores) if wall else 0:.0f}% of the cores)",
             f"{'module':<58} {'wall s':>7} {'CPU s':>7} {'cores':>5}  tests"]
    for m in modules[:shown]:
        said = ", ".join(f"{n} {o}" for o, n in sorted(m.outcomes.items()))
        lines.append(f"{m.module:<58} {m.wall:7.0f} {m.cpu:7.0f} {m.cpu / m.wall if m.wall else 0:5.2f}  {said}")
    rest = modules[shown:]
    if rest:
        lines.append(f"{f'({len(rest)} more)':<58} {sum(m.wall for m in rest):7.0f} {sum(m.cpu for m in rest):7.0f}")
    return lines


def row(records: list[dict], machine: str) -> str:
    """One run's row for docs/benchmarks.md (date | commit | machine | result | time), from the
    records its lanes wrote. The time is the longest lane's modules end to end: pytest's own
    collection and .ci/run's setup and lint are not in it."""
    if not records:
        raise ValueError("no records: give the JSON files one run's lanes wrote")
    commits = {r["commit"] for r in records}
    if len(commits) != 1:
        raise ValueError(f"records of different commits ({', '.join(sorted(commits))}): give one run's lanes")
    outcomes: dict[str, int] = {}
    for record in records:
        for module in record["modules"]:
            for outcome, n in module["outcomes"].items():
                outcomes[outcome] = outcomes.get(outcome, 0) + n
    walls = [sum(m["wall"] for m in r["modules"]) for r in records]
    longest, cores = max(walls), records[0]["cores"]
    cpu = sum(m["cpu"] for m in records[walls.index(longest)]["modules"])
    result = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items(), key=lambda item: -item[1]))
    lanes = " / ".join(f"{w / 60:.0f}" for w in walls)
    busy = 100 * cpu / (longest * cores) if longest else 0
    return (f"| {max(r['date'] for r in records)[:10]} | {records[0]['commit']} | {machine} ({cores} cores) | "
            f"{result} | {longest / 60:.0f} min in {len(records)} lane{'s' if len(records) > 1 else ''} "
            f"({lanes} min each; the machine's CPU {busy:.0f} % busy) |")


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


# The plugin's hooks: one profile per session.
_profile = SuiteProfile()


def pytest_runtest_logstart(nodeid, location):
    _profile.start(nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _profile.finish()


def pytest_runtest_logreport(report):
    _profile.report(report)


def pytest_terminal_summary(terminalreporter):
    if not _profile.modules:
        return
    record = _profile.record(_commit(), os.cpu_count() or 1)
    out = cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    # .ci/run's lanes finish close together: each keeps its own record.
    lane = os.environ.get("GPUBOOT_TEST_LANE")
    suffix = f"-lane{lane}" if lane else ""
    path = out / f"{record['date'].replace(':', '')}-{record['commit']}{suffix}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    terminalreporter.write_sep("=", "suite cost per module")
    for line in table(record):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"every module: {path}")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if arguments[:1] == ["--row"]:
        machine = os.environ.get("GPUBOOT_BENCH_MACHINE", "this machine")
        print(row([json.loads(Path(name).read_text()) for name in arguments[1:]], machine))
    else:
        for name in arguments:
            print("\n".join(table(json.loads(Path(name).read_text()), shown=10**6)))
