"""The suite's cost per module (tests/bench/suite_profile.py): what CI prints is what happened."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from tests.bench import suite_profile
from tests.bench.suite_profile import SuiteProfile, busy_seconds, outcome_of, table

STAT = "cpu  100 20 30 5000 70 4 6 0 0 0\ncpu0 50 10 15 2500 35 2 3 0 0 0\n"


def test_busy_time_leaves_out_idle_and_waiting_for_io():
    assert busy_seconds(STAT) == (100 + 20 + 30 + 4 + 6) / os.sysconf("SC_CLK_TCK")


def _report(nodeid, when, outcome, longrepr=None):
    return SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, passed=outcome == "passed",
                           failed=outcome == "failed", skipped=outcome == "skipped", longrepr=longrepr)


def test_each_test_counts_once_and_a_reuse_is_told_from_a_skip():
    m = "tests/integration/test_lab_x.py"
    said = [outcome_of(r) for r in (
        _report(f"{m}::a", "setup", "passed"), _report(f"{m}::a", "call", "passed"), _report(f"{m}::a", "teardown", "passed"),
        _report(f"{m}::b", "setup", "skipped", ("f", 1, "Skipped: REUSED: passed on this machine")),
        _report(f"{m}::b", "teardown", "passed"),
        _report(f"{m}::c", "setup", "skipped", ("f", 1, "Skipped: no lab")),
        _report(f"{m}::d", "setup", "failed"), _report(f"{m}::d", "teardown", "passed"),
        _report(f"{m}::e", "call", "passed"), _report(f"{m}::e", "teardown", "failed"))]
    assert [s for s in said if s] == ["passed", "reused", "skipped", "failed", "passed", "failed"]


def test_wall_and_cpu_add_up_per_module_and_the_table_names_the_costliest_first():
    ticks = iter([0, 10, 10, 20, 100, 400])  # wall: a 10 s, b 10 s, c 300 s
    cpu = iter([0, 5, 5, 20, 100, 700])       # cpu: a 5 s, b 15 s, c 600 s
    profile = SuiteProfile(clock=lambda: next(ticks), cpu=lambda: next(cpu))
    for nodeid in ("tests/unit/test_a.py::x", "tests/unit/test_a.py::y", "tests/integration/test_lab.py::z"):
        profile.start(nodeid)
        profile.report(_report(nodeid, "call", "passed"))
        profile.finish()
    record = profile.record("abc1234", cores=2)
    assert [(m["module"], m["wall"], m["cpu"]) for m in record["modules"]] == [
        ("tests/integration/test_lab.py", 300, 600), ("tests/unit/test_a.py", 20, 20)]
    lines = table(record)
    assert lines[0] == "suite cost at abc1234 on 2 cores: 5.3 min wall, 10.3 core-min of CPU (97% of the cores)"
    assert lines[2].split() == ["tests/integration/test_lab.py", "300", "600", "2.00", "1", "passed"]
    assert lines[3].split() == ["tests/unit/test_a.py", "20", "20", "1.00", "2", "passed"]


def test_a_module_all_reused_reads_as_reused():
    profile = SuiteProfile(clock=lambda: 0.0, cpu=lambda: 0.0)
    profile.report(_report("t.py::a", "setup", "skipped", "REUSED: record x"))
    assert profile.modules["t.py"].reused
    profile.report(_report("t.py::b", "call", "passed"))
    assert not profile.modules["t.py"].reused


def test_a_run_s_row_adds_its_lanes_outcomes_and_takes_the_longest_lane():
    lane0 = {"date": "2026-11-28T18:45:42Z", "commit": "abc1234", "cores": 2, "modules": [
        {"module": "tests/integration/test_lab.py", "wall": 2400.0, "cpu": 4000.0, "outcomes": {"passed": 6}},
        {"module": "tests/integration/test_kept.py", "wall": 3.0, "cpu": 2.0, "outcomes": {"reused": 3}}]}
    lane1 = {"date": "2026-11-28T18:46:39Z", "commit": "abc1234", "cores": 2, "modules": [
        {"module": "tests/unit/test_x.py", "wall": 1200.0, "cpu": 2000.0, "outcomes": {"passed": 40, "failed": 1}}]}
    assert suite_profile.row([lane0, lane1], "ci01") == (
        "| 2026-11-28 | abc1234 | ci01 (2 cores) | 46 passed, 3 reused, 1 failed | 40 min in 2 lanes "
        "(40 / 20 min each; the machine's CPU 83 % busy) |")


def test_a_row_is_one_run_s_lanes():
    record = {"date": "2026-11-28T10:00:00Z", "commit": "a", "cores": 2, "modules": []}
    with pytest.raises(ValueError, match="different commits"):
        suite_profile.row([record, dict(record, commit="b")], "m")
    with pytest.raises(ValueError, match="no records"):
        suite_profile.row([], "m")
