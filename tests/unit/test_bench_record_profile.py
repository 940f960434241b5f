"""tests/bench/record_profile.py: a recorded module's time, run by run, from what .ci/record keeps."""
from __future__ import annotations

import json

from tests.bench.record_profile import modules, report


def _run_log(path, run_id, started, lines):
    path.mkdir(parents=True)
    body = [f'{started} RunStarted {json.dumps({"run_id": run_id, "cluster": "k", "phases": ["a", "b"], "log": "x"})}']
    body += lines
    (path / "gpuboot.log").write_text("\n".join(body) + "\n")


def test_runs_in_order_with_their_phases_and_the_share_outside_them(tmp_path):
    runs = tmp_path / "test_lab_x-runs" / "k0" / "state" / "k" / "runs"
    _run_log(runs / "20261205T100500-bbbb", "20261205T100500-bbbb", "10:05:00", [
        '10:05:01 PhaseFinished {"phase": "a", "status": "ok", "changed": 1, "failed_hosts": [], "seconds": 30.0}',
        '10:06:40 PhaseFinished {"phase": "b", "status": "failed", "changed": 0, "failed_hosts": ["h"], "seconds": 69.0}',
        '10:06:40 RunFinished {"run_id": "20261205T100500-bbbb", "status": "failed"}'])
    # Killed: no RunFinished line.
    _run_log(runs / "20261205T100000-aaaa", "20261205T100000-aaaa", "10:00:00", [
        '10:02:00 PhaseFinished {"phase": "a", "status": "ok", "changed": 3, "failed_hosts": [], "seconds": 120.0}'])
    (tmp_path / "test_lab_x.log").write_text("......\n==== 2 passed, 3 warnings in 600.00s (0:10:00) ====\n")

    found = modules(tmp_path)["test_lab_x"]
    assert [r.run_id for r in found] == ["20261205T100000-aaaa", "20261205T100500-bbbb"]
    assert [r.wall for r in found] == [120.0, 100.0]
    assert found[1].phases == {"a": 30.0, "b": 69.0} and found[1].status == "failed"
    assert found[0].status == ""
    said = report(tmp_path, top=1)
    assert "test_lab_x: 10 min 0 s, 2 gpuboot runs" in said
    assert "no end" in said.splitlines()[1] and "slowest: a 120 s" in said.splitlines()[1]
    assert "slowest: b 69 s" in said.splitlines()[2]
    assert "in gpuboot runs 3 min 40 s (37 %)" in said and "waits 6 min 20 s" in said


def test_an_empty_log_folder_says_so(tmp_path):
    assert "no <module>-runs folder" in report(tmp_path)
