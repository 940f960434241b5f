"""The run profiler reads ansible-runner's kept events: a task's wall runs to the next task's
start, and a host's own durations are its own."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench import run_profile


def _write(run_dir: Path, phase: str, events: list[tuple[str, float, dict]]) -> None:
    folder = run_dir / "phases" / phase / "job_events"
    folder.mkdir(parents=True)
    for n, (kind, at, data) in enumerate(events, start=1):
        created = f"2026-11-27T01:00:{at:09.6f}+00:00"
        (folder / f"{n}-x.json").write_text(json.dumps({"event": kind, "created": created, "event_data": data}))


def test_task_wall_runs_to_the_next_task_and_names_the_slowest_host(tmp_path):
    _write(tmp_path, "upgrade_workers", [
        ("playbook_on_start", 0.0, {}),
        ("playbook_on_task_start", 1.0, {"task": "drain"}),
        ("runner_on_ok", 3.0, {"task": "drain", "host": "w1", "duration": 2.0}),
        ("runner_on_ok", 9.0, {"task": "drain", "host": "w2", "duration": 8.0}),
        ("playbook_on_task_start", 10.0, {"task": "uncordon"}),
        ("runner_on_ok", 11.0, {"task": "uncordon", "host": "w1", "duration": 1.0}),
        ("playbook_on_stats", 12.0, {}),
    ])
    walls = {t.task: t for t in run_profile.task_walls(tmp_path)}
    assert walls["drain"].wall == 9.0 and walls["drain"].slowest_host == "w2" and walls["drain"].slowest == 8.0
    assert walls["uncordon"].wall == 2.0
    assert run_profile.phase_walls(tmp_path) == {"upgrade_workers": 12.0}
    assert run_profile.host_tasks(tmp_path, "w1") == [("upgrade_workers", "drain", 2.0),
                                                      ("upgrade_workers", "uncordon", 1.0)]


def test_a_folder_that_is_not_a_run_is_refused_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        run_profile.main([str(tmp_path)])
    assert stopped.value.code == 2
    assert f"{tmp_path} has no phases/ folder" in capsys.readouterr().err
