""".ci/record, which a new machine runs before CI: it must record every module that CI would
otherwise run cold (each module that opts in to tests/support/reuse.py), in CI's environment."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.bench.lanes import REUSE_MARK

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "record"


def default_modules(script: str) -> list[str]:
    """The modules .ci/record runs when it is given none: its `modules=(...)` default."""
    found = re.search(r"^\s*modules=\((test_[^)]*)\)", script, re.M)
    assert found, ".ci/record has no default modules=(...) list"
    return found.group(1).split()


def reused_modules(root: Path = ROOT) -> set[str]:
    """The integration modules whose passes tests/support/reuse.py records, found as the lane
    split finds them."""
    return {path.name for path in (root / "tests" / "integration").glob("test_*.py")
            if REUSE_MARK in path.read_text()}


def test_it_records_every_module_that_opts_in_to_reuse_once():
    modules = default_modules(SCRIPT.read_text())
    assert len(modules) == len(set(modules)), modules
    assert set(modules) == reused_modules()
    for name in modules:
        assert (ROOT / "tests" / "integration" / name).is_file(), name


def test_the_ha_module_goes_first_since_it_takes_longest():
    assert default_modules(SCRIPT.read_text())[0] == "test_lab_cluster.py"


def test_it_runs_in_the_environment_ci_gives_the_lanes():
    """The GPUBOOT_ variables are in every key: a record made with other values is never
    reused. .ci/run exports GPUBOOT_REQUIRE_LAB=1 and, with two lanes, GPUBOOT_MOLECULE_PARALLEL;
    .ci/record must export the same, and unset the switches that force fresh runs."""
    script, ci = SCRIPT.read_text(), (ROOT / ".ci" / "run").read_text()
    assert "export GPUBOOT_REQUIRE_LAB=1" in ci
    assert re.search(r"^export GPUBOOT_REQUIRE_LAB=1 GPUBOOT_MOLECULE_PARALLEL=1$", script, re.M)
    assert 'GPUBOOT_MOLECULE_PARALLEL="${GPUBOOT_MOLECULE_PARALLEL:-1}"' in ci
    assert re.search(r"^unset .*GPUBOOT_TESTS_FRESH.*GPUBOOT_MOLECULE_FRESH", script, re.M)


def test_it_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True).returncode == 0


def test_it_ends_with_its_row_for_the_benchmarks_table():
    """The row is the script's own, with the table's five columns (date | commit | result |
    time | the slowest): the figures are written by the run that measured them."""
    script = SCRIPT.read_text()
    ending = script[script.index("# The row for docs/benchmarks.md"):]
    header = next(line for line in (ROOT / "docs" / "benchmarks.md").read_text().split("## The recorded lab modules")[1]
                  .splitlines() if line.startswith("| date"))
    setup = ('began=$(( $(date +%s) - 4700 )); failed=0; '
             'timings=("test_lab_cluster passed and recorded 40 min 20 s" "molecule 15 passed, 1 skipped"); '
             'slowest=("test_upgrade 1422.52s")\n')
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + setup + ending], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[-1]
    assert row.count("|") == header.count("|") == 6, (row, header)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", cells[0]) and "`bash .ci/record`" in cells[1]
    assert cells[2] == "test_lab_cluster passed and recorded 40 min 20 s; molecule 15 passed, 1 skipped"
    assert cells[3].startswith("78 min from the first module") and cells[4] == "test_upgrade 1422.52s"
