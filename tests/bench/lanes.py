"""Splits the suite's test files into lanes that .ci/run runs at the same time, one pytest each,
so that the waits of one lane's lab (kubeadm, drains, the gate's settle time) overlap with the
other's work. Each file goes whole to one lane (a module's tests share its lab and run in order).

The files that build a Kubernetes cluster in the lab (a kubernetes-flavour lab) stay together,
one after another, in one lane: two kubeadm clusters at once on a 2-core machine starve each
other's API servers until kubeadm gives up (seen: "client rate limiter Wait returned an error"
in kubeadm init). The other files fill the lanes around them.

A file's cost is its wall time in the newest suite profiles in which it ran (not every test
REUSED; the lower median of three): tests/bench/suite_profile.py keeps them under
~/.cache/gpuboot/suite-profile. On a machine with no profile of a file, lane_costs.json beside
this file gives the cost measured for it, and a file in neither is given a guess by where it
lives. The longest go first, each to the lane with the
least so far (longest processing time first, within 4/3 of the best split).

A file whose results this machine will reuse costs what its reuse costs, not its cold time: a
lab module that tests/support/reuse.py will skip whole as REUSED, and the share of molecule's
scenarios that gpuboot_lab.molecule will reuse. Both are asked with the same keys the tests
use, in the environment the lanes will run in (.ci/run exports it first).

    .venv/bin/python -m tests.bench.lanes --lanes 2 tests     # one line of files per lane
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.bench.suite_profile import cache_dir
from tests.support.reuse import HARNESS, PRODUCT, ModuleKey, recorded_pass

ROOT = Path(__file__).resolve().parents[2]
# Seconds for a file no profile has seen: lab modules are minutes, the rest seconds.
GUESS = {"tests/integration/": 90.0, "tests/gpu/": 10.0}
DEFAULT_GUESS = 10.0
MEASURED = Path(__file__).with_name("lane_costs.json")


def measured(path: Path = MEASURED) -> dict[str, float]:
    """The costs the repository carries for a machine with no profiles (see lane_costs.json)."""
    return {file: float(seconds) for file, seconds in json.loads(path.read_text())["seconds"].items()}


def test_files(paths: list[str], root: Path = ROOT) -> list[str]:
    """Every test file under the paths, relative to the root, sorted."""
    found: set[str] = set()
    for given in paths:
        path = (root / given).resolve()
        files = [path] if path.is_file() else path.rglob("test_*.py")
        found.update(str(f.relative_to(root)) for f in files if f.name.startswith("test_") and f.suffix == ".py")
    return sorted(found)


# How many of a module's newest runs its cost is taken from.
RUNS = 3


def costs(records: list[dict]) -> dict[str, float]:
    """Each module's wall time: the lower median of its RUNS newest records where it ran (records
    in any order). One run that hung (seen: apt stuck 46 min) does not make it look long, nor one
    cut short look cheap; a lasting change shows after two runs."""
    walls: dict[str, list[float]] = {}
    for record in sorted(records, key=lambda r: r["date"], reverse=True):
        for module in record["modules"]:
            outcomes = set(module["outcomes"])
            if outcomes and not outcomes <= {"reused", "skipped"}:
                walls.setdefault(module["module"], []).append(module["wall"])
    return {module: sorted(seen[:RUNS])[(len(seen[:RUNS]) - 1) // 2] for module, seen in walls.items()}


def recorded(directory: Path | None = None) -> list[dict]:
    directory = directory or cache_dir()
    records = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a record cut off mid-write says nothing
    return records


def guess(file: str) -> float:
    return next((seconds for prefix, seconds in GUESS.items() if file.startswith(prefix)), DEFAULT_GUESS)


# What marks a lab module that reuses a recorded pass (tests/support/reuse.py), and what its
# skip costs: collection and the key's hashing.
REUSE_MARK = "reuse_module(request)"
REUSED_SECONDS = 5.0
MOLECULE = "tests/integration/test_molecule.py"


def module_reused(file: str, root: Path = ROOT) -> bool:
    """Whether tests/support/reuse.py will skip this whole module as REUSED here and now."""
    if REUSE_MARK not in (root / file).read_text():
        return False
    return recorded_pass(ModuleKey.now(root / file, (*PRODUCT, *HARNESS))) is not None


def molecule_share() -> float:
    """The share of molecule's scenarios that will run, not be reused (gpuboot_lab.molecule's keys)."""
    from gpuboot_lab.molecule import ScenarioRunner, roles_with_scenarios
    roles = roles_with_scenarios()
    with tempfile.TemporaryDirectory() as scratch:
        runner = ScenarioRunner(Path(scratch), log=lambda message: None)
        running = [role for role in roles if runner.reused(role) is None]
    return len(running) / len(roles) if roles else 0.0


def after_reuse(files: list[str], known: dict[str, float], root: Path = ROOT) -> dict[str, float]:
    """The costs, with what this machine will reuse priced at its reuse."""
    priced = dict(known)
    for file in files:
        if file == MOLECULE and file in known:
            priced[file] = max(REUSED_SECONDS, known[file] * molecule_share())
        elif module_reused(file, root):
            priced[file] = REUSED_SECONDS
    return priced


# What marks a file that builds a kubeadm cluster in the lab.
CLUSTER_MARK = 'flavour="kubernetes"'


def builds_a_cluster(file: str, root: Path = ROOT) -> bool:
    return CLUSTER_MARK in (root / file).read_text()


def split(files: list[str], known: dict[str, float], lanes: int,
          together: frozenset[str] = frozenset()) -> list[list[str]]:
    """Files into `lanes` lists, longest first to the least loaded, the `together` files as one
    block in one lane; each list sorted."""
    if lanes < 1:
        raise ValueError(f"{lanes} lanes: at least one")
    cost = {f: known.get(f, guess(f)) for f in files}
    blocks = [[f] for f in files if f not in together]
    if together & set(files):
        blocks.append(sorted(together & set(files)))
    load = [0.0] * lanes
    assigned: list[list[str]] = [[] for _ in range(lanes)]
    for block in sorted(blocks, key=lambda b: (-sum(cost[f] for f in b), b)):
        lane = min(range(lanes), key=lambda i: (load[i], i))
        assigned[lane] += block
        load[lane] += sum(cost[f] for f in block)
    return [sorted(files) for files in assigned if files]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--explain", action="store_true", help="each lane's files and expected seconds, to stderr")
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    files = test_files(args.paths)
    known = after_reuse(files, measured() | costs(recorded()))
    plan = split(files, known, args.lanes, frozenset(f for f in files if builds_a_cluster(f)))
    for lane, members in enumerate(plan):
        print(" ".join(members))
        if args.explain:
            seconds = sum(known.get(f, guess(f)) for f in members)
            print(f"lane {lane}: {len(members)} files, about {seconds / 60:.0f} min", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
