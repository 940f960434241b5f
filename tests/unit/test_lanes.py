"""The suite's lanes (tests/bench/lanes.py): every test file in exactly one lane, the costs the
newest profile in which a file ran, the longest spread first."""
from __future__ import annotations

import json

import pytest

from tests.bench import lanes


def record(date: str, **walls) -> dict:
    return {"date": date, "commit": "c", "cores": 2,
            "modules": [{"module": name.replace("__", "/") + ".py", "wall": wall,
                         "cpu": 0.0, "outcomes": outcomes}
                        for name, (wall, outcomes) in walls.items()]}


def test_every_file_once_and_the_long_ones_apart():
    known = {"a.py": 3000.0, "b.py": 2000.0, "c.py": 1500.0, "d.py": 100.0, "e.py": 50.0}
    plan = lanes.split(list(known), known, 2)
    assert sorted(f for lane in plan for f in lane) == sorted(known)
    assert not any({"a.py", "b.py"} <= set(lane) for lane in plan)
    loads = sorted(sum(known[f] for f in lane) for lane in plan)
    assert loads == [3150.0, 3500.0]  # a+d+e and b+c


def test_one_lane_is_the_whole_suite_and_none_is_refused():
    assert lanes.split(["b.py", "a.py"], {}, 1) == [["a.py", "b.py"]]
    with pytest.raises(ValueError, match="0 lanes"):
        lanes.split(["a.py"], {}, 0)


def test_more_lanes_than_files_gives_no_empty_lane():
    assert lanes.split(["a.py"], {}, 3) == [["a.py"]]


def test_a_cost_is_the_lower_median_of_the_newest_runs_never_a_reused_one():
    records = [
        record("2026-11-28T10:00:00Z", tests__integration__test_lab=(1100.0, {"passed": 9})),
        record("2026-11-28T12:00:00Z", tests__integration__test_lab=(0.5, {"reused": 9}),
               tests__unit__test_x=(3.0, {"passed": 4})),
        record("2026-11-27T10:00:00Z", tests__integration__test_lab=(1000.0, {"passed": 9})),
        # One run that hung, the newest: it does not make the module look long.
        record("2026-11-28T14:00:00Z", tests__integration__test_lab=(3200.0, {"passed": 9})),
        # Older than the three newest runs: not counted.
        record("2026-11-20T10:00:00Z", tests__integration__test_lab=(50.0, {"passed": 9})),
    ]
    assert lanes.costs(records) == {"tests/integration/test_lab.py": 1100.0, "tests/unit/test_x.py": 3.0}
    # Two runs: the lower; a lasting change (both runs long) shows.
    assert lanes.costs(records[2:4]) == {"tests/integration/test_lab.py": 1000.0}
    assert lanes.costs([record("2026-11-29T10:00:00Z", tests__integration__test_lab=(3000.0, {"passed": 9})),
                        records[3]]) == {"tests/integration/test_lab.py": 3000.0}


def test_an_unseen_file_is_guessed_by_where_it_lives():
    assert lanes.guess("tests/integration/test_new.py") > 60 > lanes.guess("tests/unit/test_new.py")


def test_records_are_read_and_a_cut_off_one_is_passed_over(tmp_path):
    (tmp_path / "1.json").write_text(json.dumps(record("2026-11-28T10:00:00Z", tests__unit__test_x=(3.0, {"passed": 1}))))
    (tmp_path / "2.json").write_text('{"date": "2026-11-28T11:')
    assert [r["date"] for r in lanes.recorded(tmp_path)] == ["2026-11-28T10:00:00Z"]
    assert lanes.recorded(tmp_path / "none") == []


def test_the_suite_s_files_are_found(tmp_path):
    for name in ("tests/unit/test_a.py", "tests/unit/helper.py", "tests/integration/test_b.py", "tests/conftest.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert lanes.test_files(["tests"], tmp_path) == ["tests/integration/test_b.py", "tests/unit/test_a.py"]


def test_the_command_prints_one_line_per_lane(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(lanes, "recorded", lambda: [])
    assert lanes.main(["--lanes", "2", "tests/unit/test_lanes.py", "tests/unit/test_reuse.py"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert sorted(printed) == ["tests/unit/test_lanes.py", "tests/unit/test_reuse.py"]


def test_the_cluster_builders_share_one_lane_one_after_another():
    known = {"k1.py": 2800.0, "k2.py": 900.0, "k3.py": 500.0, "u.py": 1500.0, "v.py": 1400.0, "w.py": 600.0}
    plan = lanes.split(list(known), known, 2, together=frozenset({"k1.py", "k2.py", "k3.py"}))
    assert ["k1.py", "k2.py", "k3.py"] in plan
    assert sorted(f for lane in plan for f in lane) == sorted(known)


def test_the_files_that_build_a_cluster_are_found_by_their_lab_s_flavour(tmp_path):
    (tmp_path / "test_k.py").write_text('spec = LabSpec(name="k", flavour="kubernetes")\n')
    (tmp_path / "test_p.py").write_text('spec = LabSpec(name="p")\n')
    assert lanes.builds_a_cluster("test_k.py", tmp_path) and not lanes.builds_a_cluster("test_p.py", tmp_path)
    assert lanes.builds_a_cluster("tests/integration/test_lab_cluster.py")


def test_the_carried_costs_name_files_that_exist_and_a_machine_s_own_profile_wins(monkeypatch):
    carried = lanes.measured()
    assert carried and all((lanes.ROOT / f).is_file() and seconds > 0 for f, seconds in carried.items())
    monkeypatch.setattr(lanes, "recorded", lambda: [record("2026-11-28T10:00:00Z",
                                                           tests__integration__test_lab_faults=(5.0, {"passed": 1}))])
    assert (lanes.measured() | lanes.costs(lanes.recorded()))["tests/integration/test_lab_faults.py"] == 5.0


def test_on_a_machine_with_no_profile_the_cluster_lane_holds_the_cluster_builders_and_little_else(monkeypatch, capsys):
    # A fresh machine: no profile, and no record of a lab module or a molecule scenario.
    monkeypatch.setattr(lanes, "recorded", lambda: [])
    monkeypatch.setattr(lanes, "module_reused", lambda file, root=lanes.ROOT: False)
    monkeypatch.setattr(lanes, "molecule_share", lambda: 1.0)
    assert lanes.main(["--lanes", "2", "tests"]) == 0
    plan = [line.split() for line in capsys.readouterr().out.splitlines()]
    cluster = next(lane for lane in plan if "tests/integration/test_lab_cluster.py" in lane)
    other = next(lane for lane in plan if lane is not cluster)
    assert "tests/integration/test_molecule.py" in other
    assert not [f for f in cluster if f.startswith("tests/integration/") and not lanes.builds_a_cluster(f)]


REUSING_MODULE = "import pytest\nfrom tests.support.reuse import reuse_module\n\n" \
                 "@pytest.fixture(scope='module')\ndef reused(request):\n    yield from reuse_module(request)\n"


def test_a_module_this_machine_will_reuse_costs_its_skip(tmp_path, monkeypatch):
    from tests.support import reuse
    (tmp_path / "tests").mkdir()
    for name in ("test_kept.py", "test_new.py"):
        (tmp_path / "tests" / name).write_text(REUSING_MODULE + f"# {name}\n")
    monkeypatch.setattr(reuse, "CACHE", tmp_path / "passes")
    monkeypatch.delenv(reuse.FRESH_ENV, raising=False)
    record = reuse.ModuleKey.now(tmp_path / "tests/test_kept.py", (*reuse.PRODUCT, *reuse.HARNESS)).record
    record.parent.mkdir()
    record.write_text("{}")
    files = ["tests/test_kept.py", "tests/test_new.py"]
    known = {"tests/test_kept.py": 2400.0, "tests/test_new.py": 900.0}
    assert lanes.after_reuse(files, known, tmp_path) == {"tests/test_kept.py": lanes.REUSED_SECONDS,
                                                         "tests/test_new.py": 900.0}
    # A fresh run reuses nothing: every file at its cold cost.
    monkeypatch.setenv(reuse.FRESH_ENV, "1")
    assert lanes.after_reuse(files, known, tmp_path) == known


def test_molecule_costs_the_share_of_its_scenarios_that_will_run(monkeypatch):
    monkeypatch.setattr(lanes, "molecule_share", lambda: 0.25)
    assert lanes.after_reuse([lanes.MOLECULE], {lanes.MOLECULE: 1200.0}) == {lanes.MOLECULE: 300.0}
    monkeypatch.setattr(lanes, "molecule_share", lambda: 0.0)
    assert lanes.after_reuse([lanes.MOLECULE], {lanes.MOLECULE: 1200.0}) == {lanes.MOLECULE: lanes.REUSED_SECONDS}
