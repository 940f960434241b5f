from __future__ import annotations

from pathlib import Path

import pytest

from gpuboot.config.loader import load_cluster
from gpuboot.errors import LockedError
from gpuboot.events import PhaseSkipped, PhaseStarted, RunFinished, TaskStarted
from gpuboot.phases.catalog import UP
from gpuboot.phases.engine import Engine, RunOptions
from gpuboot.state import ClusterState
from tests.doubles.runner_double import RunnerDouble, ScriptedPhase

ROOT = Path(__file__).resolve().parents[2]
PHASES = [p for p in UP if p.name in ("preflight", "os_prep")]


@pytest.fixture
def cluster():
    return load_cluster(ROOT / "inventories" / "sample" / "inventory.yml")


def run(cluster, tmp_path, runner, **options):
    events = []
    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)
    engine = Engine(cluster, state, RunOptions(**options), events.append, runner=runner)
    return engine.run(PHASES), events, state


def test_success_records_state_and_rerun_skips_up_to_date_phases(cluster, tmp_path):
    runner = RunnerDouble({"preflight": ScriptedPhase({"cp01": "ok"}), "os_prep": ScriptedPhase({"cp01": "changed"})})
    finished, events, state = run(cluster, tmp_path, runner)
    assert finished.status == "ok" and finished.phases_run == ["preflight", "os_prep"]
    recorded = state.load()["phases"]
    assert recorded["os_prep"]["status"] == "ok" and recorded["os_prep"]["changed"] == 1
    assert Path(finished.log).read_text().count("PhaseFinished") == 2

    again, events, _ = run(cluster, tmp_path, runner)
    assert again.phases_run == []
    assert [e.phase for e in events if isinstance(e, PhaseSkipped)] == ["preflight", "os_prep"]
    forced, _, _ = run(cluster, tmp_path, runner, force=True)
    assert forced.phases_run == ["preflight", "os_prep"]


def test_failure_stops_and_names_hosts_task_message_and_resume(cluster, tmp_path):
    runner = RunnerDouble({"preflight": ScriptedPhase({"cp01": "ok", "gpu01": "failed", "gpu02": "unreachable"},
                                                      message="nouveau is loaded")})
    finished, events, state = run(cluster, tmp_path, runner)
    assert finished.status == "failed"
    assert finished.phases_run == ["preflight"]  # os_prep never started
    assert {f.host for f in finished.failures} == {"gpu01", "gpu02"}
    assert all(f.message == "nouveau is loaded" and f.task == "preflight | work" for f in finished.failures)
    assert finished.resume.endswith("--from preflight")
    assert state.load()["phases"]["preflight"]["status"] == "failed"
    # After a failure the phase runs again: nothing is skipped on the way back.
    runner.script["preflight"] = ScriptedPhase({"cp01": "ok"})
    finished, _, _ = run(cluster, tmp_path, runner)
    assert finished.phases_run == ["preflight", "os_prep"]


def test_inputs_change_reruns_the_phase(cluster, tmp_path):
    runner = RunnerDouble()
    run(cluster, tmp_path, runner)
    changed = cluster.model_copy(update={"source_files": cluster.source_files + (str(ROOT / "README.md"),)})
    finished, _, _ = run(changed, tmp_path, runner)
    assert finished.phases_run == ["preflight", "os_prep"]


def test_second_run_on_a_locked_cluster_is_refused(cluster, tmp_path):
    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)
    with state.lock("test holder"):
        with pytest.raises(LockedError, match="test holder"):
            run(cluster, tmp_path, RunnerDouble())


def test_ctrl_c_cancels_the_running_playbook_and_says_how_to_resume(cluster, tmp_path):
    runner = RunnerDouble({"preflight": ScriptedPhase({"cp01": "ok"}, wait_for_cancel=True)})
    events = []

    def sink(event):
        events.append(event)
        if isinstance(event, TaskStarted):
            raise KeyboardInterrupt

    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)
    finished = Engine(cluster, state, RunOptions(), sink, runner=runner).run(PHASES)
    assert finished.status == "interrupted"
    assert "--from preflight" in finished.resume
    assert isinstance(events[-1], RunFinished)
    assert [e.phase for e in events if isinstance(e, PhaseStarted)] == ["preflight"]


def test_check_mode_never_records_or_skips(cluster, tmp_path):
    runner = RunnerDouble()
    run(cluster, tmp_path, runner)
    finished, _, state = run(cluster, tmp_path, runner, check=True, force=True)
    assert finished.phases_run == ["preflight", "os_prep"]
    assert all(call.check for call in runner.calls[-2:])
