from __future__ import annotations

import shutil
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuboot.config.loader import load_cluster
from gpuboot.errors import LockedError
from gpuboot.events import PhaseSkipped, PhaseStarted, RunFinished, TaskStarted
from gpuboot.phases.catalog import UP
from gpuboot.phases.engine import Engine, RunOptions, forks_for
from gpuboot.state import ClusterState
from tests.doubles.runner_double import RunnerDouble, ScriptedPhase

ROOT = Path(__file__).resolve().parents[2]
PHASES = [p for p in UP if p.name in ("preflight", "os_prep")]


@pytest.fixture
def cluster():
    return load_cluster(ROOT / "inventories" / "sample" / "inventory.yml")


def run(cluster, tmp_path, runner, phases=PHASES, **options):
    events = []
    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)
    engine = Engine(cluster, state, RunOptions(**options), events.append, runner=runner)
    return engine.run(phases), events, state


def test_success_records_state_and_rerun_skips_converged_phases(cluster, tmp_path):
    runner = RunnerDouble({"preflight": ScriptedPhase({"cp01": "ok"}), "os_prep": ScriptedPhase({"cp01": "changed"})})
    finished, events, state = run(cluster, tmp_path, runner)
    assert finished.status == "ok" and finished.phases_run == ["preflight", "os_prep"]
    recorded = state.load()["phases"]
    assert recorded["os_prep"]["status"] == "ok" and recorded["os_prep"]["changed"] == 1
    assert Path(finished.log).read_text().count("PhaseFinished") == 2
    # The hosts now hold os_prep's record; the lock was given back.
    assert all(runner.hosts.records[h]["os_prep"] for h in ("cp01", "gpu01", "cpu01"))
    assert runner.hosts.lock is None

    again, events, _ = run(cluster, tmp_path, runner)
    assert again.phases_run == []
    assert [e.phase for e in events if isinstance(e, PhaseSkipped)] == ["preflight", "os_prep"]
    forced, _, _ = run(cluster, tmp_path, runner, force=True)
    assert forced.phases_run == ["preflight", "os_prep"]


def test_a_host_that_lost_a_phase_result_reruns_it_without_force(cluster, tmp_path):
    runner = RunnerDouble()
    run(cluster, tmp_path, runner)
    runner.hosts.broken[("gpu02", "os_prep")] = "/etc/sysctl.d/90-gpuboot.conf is missing"
    finished, events, _ = run(cluster, tmp_path, runner)
    assert finished.phases_run == ["preflight", "os_prep"]  # preflight runs before a phase that changes hosts
    started = next(e for e in events if isinstance(e, PhaseStarted) and e.phase == "os_prep")
    assert started.reason == "gpu02: /etc/sysctl.d/90-gpuboot.conf is missing; only on gpu02"
    # A re-imaged node (no records at all) is found the same way.
    runner.hosts.records.pop("cp02")
    finished, events, _ = run(cluster, tmp_path, runner)
    assert finished.phases_run == ["preflight", "os_prep"]
    assert run(cluster, tmp_path, runner)[0].phases_run == []


def test_a_host_that_cannot_keep_the_record_fails_the_run_naming_it_and_runs_again_next_time(cluster, tmp_path):
    runner = RunnerDouble()
    runner.hosts.full.add("gpu02")
    finished, _, _ = run(cluster, tmp_path, runner)
    assert finished.status == "failed" and finished.phases_run == ["preflight", "os_prep"]
    [failure] = finished.failures
    assert failure.host == "gpu02" and "No space left on device" in failure.message
    assert "/var/lib/gpuboot/phases" in failure.message
    assert finished.resume == f"gpuboot up {cluster.inventory} --from os_prep"
    assert runner.hosts.lock is None  # the lock was still given back
    # Once there is room, a plain run runs os_prep again on that host's account only.
    runner.hosts.full.clear()
    again, events, _ = run(cluster, tmp_path, runner)
    assert again.status == "ok" and again.phases_run == ["preflight", "os_prep"]
    started = next(e for e in events if isinstance(e, PhaseStarted) and e.phase == "os_prep")
    assert started.reason == "gpu02: no record of this phase on the host; only on gpu02"


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


def test_an_unreachable_host_without_sshs_words_is_asked_again_and_says_sshs_reason_and_fix(cluster, tmp_path):
    """With pipelining, a host refused for its key can come back as a broken pipe: gpuboot asks
    ssh once more (raw, nothing on its stdin) and the failure carries ssh's words and the fix."""
    pipe = ("Data could not be sent to remote host \"10.0.0.22\". Make sure this host can be reached over ssh: "
            "mux_client_request_session: ... Broken pipe")
    key = ("Failed to connect to the host via ssh: @@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@@\n"
           "Offending ED25519 key in /etc/gpuboot/known_hosts:7\nHost key verification failed.")
    runner = RunnerDouble({"preflight": ScriptedPhase({"cp01": "ok", "gpu02": "unreachable"}, message=pipe),
                           "preflight-ssh-check": ScriptedPhase({"gpu02": "unreachable"}, message=key)})
    finished, _, _ = run(cluster, tmp_path, runner)
    asked = [c for c in runner.calls if c.ident == "preflight-ssh-check"]
    assert [c.playbook.name for c in asked] == ["ssh_check.yml"]
    assert asked[0].extravars["gpuboot_ssh_hosts"] == ["gpu02"]
    [failure] = finished.failures
    assert failure.host == "gpu02" and failure.message.startswith(pipe)
    assert "Host key verification failed" in failure.message and "line 7 of /etc/gpuboot/known_hosts" in failure.message
    assert "Turning host-key checking off is not the fix" in failure.message
    # A host gone silent: ssh's words (a timeout) and what to look at.
    runner = RunnerDouble({
        "preflight": ScriptedPhase({"gpu02": "unreachable"}, message='Task failed: Data could not be sent to remote '
                                   'host "10.0.0.22". Make sure this host can be reached over ssh:'),
        "preflight-ssh-check": ScriptedPhase({"gpu02": "unreachable"}, message="Failed to connect to the host via "
                                             "ssh: ssh: connect to host 10.0.0.22 port 22: Connection timed out")})
    finished, _, _ = run(cluster, tmp_path / "silent", runner)
    assert "Connection timed out" in finished.failures[0].message
    assert "fix: gpu02 does not answer on SSH" in finished.failures[0].message
    # An unreachable host whose message already has ssh's words is not asked again.
    said = "Failed to connect to the host via ssh: ssh: connect to host 10.0.0.22 port 22: Connection refused"
    runner = RunnerDouble({"preflight": ScriptedPhase({"gpu02": "unreachable"}, message=said)})
    finished, _, _ = run(cluster, tmp_path / "other", runner)
    assert not [c for c in runner.calls if c.ident.endswith("ssh-check")]
    assert finished.failures[0].message.startswith(said) and "fix: gpu02 does not answer" in finished.failures[0].message


def test_inputs_change_reruns_the_phase(cluster, tmp_path):
    runner = RunnerDouble()
    run(cluster, tmp_path, runner)
    networking = cluster.settings.networking.model_copy(update={"dns_domain": "cluster.example"})
    changed = cluster.model_copy(update={"settings": cluster.settings.model_copy(update={"networking": networking})})
    finished, events, _ = run(changed, tmp_path, runner)
    assert finished.phases_run == ["preflight", "os_prep"]
    assert "inputs changed" in next(e for e in events if isinstance(e, PhaseStarted) and e.phase == "os_prep").reason


def test_editing_one_role_reruns_only_the_phases_that_use_it(cluster, tmp_path, monkeypatch):
    copy = tmp_path / "content"
    for part in ("playbooks", "roles", "mirror"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("molecule"))
    monkeypatch.setenv("GPUBOOT_CONTENT_DIR", str(copy))
    phases = [p for p in UP if p.name in ("preflight", "os_prep", "container_runtime")]
    runner = RunnerDouble()
    state = ClusterState.for_cluster(tmp_path / "state", cluster.settings.cluster_name)
    assert Engine(cluster, state, RunOptions(), lambda e: None, runner=runner).run(phases).phases_run == \
        ["preflight", "os_prep", "container_runtime"]
    tasks = copy / "roles" / "container_runtime" / "tasks" / "main.yml"
    tasks.write_text(tasks.read_text() + "\n# an edit\n")
    again = Engine(cluster, state, RunOptions(), lambda e: None, runner=runner).run(phases)
    assert again.phases_run == ["preflight", "container_runtime"]


def test_second_run_on_a_locked_cluster_is_refused(cluster, tmp_path):
    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)
    with state.lock("test holder"):
        with pytest.raises(LockedError, match="test holder"):
            run(cluster, tmp_path, RunnerDouble())


def test_the_lock_on_the_first_control_plane_refuses_a_run_from_elsewhere(cluster, tmp_path):
    runner = RunnerDouble()
    other = {"run_id": "20261123T010203-beef", "who": "alice", "where": "ops-laptop-7", "pid": 4242,
             "since": "2026-11-23T01:02:03+0000", "command": "up", "state_dir": "/home/alice/.gpuboot"}
    runner.hosts.lock = dict(other)
    # A second state directory: the local lock is free, the one on cp01 is not.
    with pytest.raises(LockedError) as info:
        run(cluster, tmp_path / "elsewhere", runner)
    text = str(info.value)
    assert "alice@ops-laptop-7" in text and "since 2026-11-23T01:02:03+0000" in text and "cp01" in text
    assert "gpuboot unlock" in text
    assert runner.hosts.lock == other  # untouched
    assert [c.ident for c in runner.calls] == ["state-begin"]  # no phase ran


def test_a_lock_left_by_a_dead_run_on_this_machine_is_taken_over(cluster, tmp_path):
    runner = RunnerDouble()
    runner.hosts.lock = {"run_id": "20261123T010203-dead", "who": "root", "where": socket.gethostname(),
                         "pid": 2 ** 22 + 17, "since": "2026-11-23T01:02:03+0000", "command": "up"}
    finished, _, _ = run(cluster, tmp_path, runner)
    assert finished.status == "ok" and runner.hosts.lock is None


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
    assert runner.hosts.lock is None  # given back
    assert "preflight" not in runner.hosts.records.get("cp01", {})


def test_check_mode_never_records_or_skips(cluster, tmp_path):
    runner = RunnerDouble()
    run(cluster, tmp_path, runner)
    finished, _, state = run(cluster, tmp_path, runner, check=True, force=True)
    assert finished.phases_run == ["preflight", "os_prep"]
    assert all(call.check for call in runner.calls[-2:])
    assert not any(c.ident.startswith("state-") for c in runner.calls[-2:])  # check mode asks no host


def test_the_gate_runs_on_every_run_and_does_not_make_preflight_run(cluster, tmp_path):
    phases = [p for p in UP if p.name in ("preflight", "os_prep", "validate")]
    runner = RunnerDouble()
    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)

    def once():
        events = []
        finished = Engine(cluster, state, RunOptions(), events.append, runner=runner).run(phases)
        return finished, events

    first, _ = once()
    assert first.phases_run == ["preflight", "os_prep", "validate"]
    again, events = once()
    # os_prep is converged, so preflight has nothing to guard; the gate checks the cluster anyway.
    assert again.phases_run == ["validate"]
    started = next(e for e in events if isinstance(e, PhaseStarted) and e.phase == "validate")
    assert started.reason == "a gate: it checks the cluster on every run"


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_stops_the_running_playbook_like_ctrl_c(cluster, tmp_path, signum):
    """A scheduler's SIGTERM (or `timeout`), or SIGHUP from a closed terminal or SSH session:
    the playbook is cancelled, the lock given back, the run recorded as interrupted with the
    resume command."""
    import os
    import signal
    import threading

    from gpuboot.cli.main import stop_signals_as_interrupt

    sent = getattr(signal, signum)
    runner = RunnerDouble({"preflight": ScriptedPhase({"cp01": "ok"}, wait_for_cancel=True)})
    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), sent))
    previous = signal.getsignal(sent)
    with stop_signals_as_interrupt():
        timer.start()
        finished = Engine(cluster, state, RunOptions(), lambda e: None, runner=runner).run(PHASES)
    assert signal.getsignal(sent) is previous
    assert finished.status == "interrupted" and "--from preflight" in finished.resume
    assert runner.hosts.lock is None
    assert state.load()["runs"][-1]["status"] == "interrupted"


def test_an_interrupt_outside_a_playbook_is_recorded_with_its_resume(cluster, tmp_path):
    """Ctrl-C between two phases (here: as the second phase is announced) never reaches a
    playbook: the run is still recorded as interrupted, the lock given back, and the resume
    starts at the first phase that did not succeed."""
    runner = RunnerDouble({"preflight": ScriptedPhase({"cp01": "ok"}), "os_prep": ScriptedPhase({"cp01": "ok"})})
    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)

    def sink(event):
        if isinstance(event, PhaseStarted) and event.phase == "os_prep":
            raise KeyboardInterrupt

    finished = Engine(cluster, state, RunOptions(), sink, runner=runner).run(PHASES)
    assert finished.status == "interrupted" and "--from os_prep" in finished.resume
    assert finished.phases_run == ["preflight"]
    assert runner.hosts.lock is None
    assert state.load()["runs"][-1]["status"] == "interrupted"
    assert state.load()["phases"]["preflight"]["status"] == "ok"


def _limits(runner) -> dict[str, tuple[str, ...]]:
    """Per phase playbook the last run asked for, its --limit (empty: every host)."""
    return {call.ident: tuple(call.limit) for call in runner.calls if not call.ident.startswith("state-")}


def _run_phases(cluster, tmp_path, runner, names):
    return run(cluster, tmp_path, runner, phases=[p for p in UP if p.name in names])[:2]


def test_a_repair_runs_only_on_the_hosts_that_lost_the_result_and_preflight_on_the_same(cluster, tmp_path):
    runner = RunnerDouble()
    _run_phases(cluster, tmp_path, runner, ("preflight", "os_prep", "container_runtime"))
    runner.hosts.broken[("gpu02", "os_prep")] = "/etc/sysctl.d/90-gpuboot.conf is missing"
    runner.hosts.broken[("cpu01", "container_runtime")] = "/etc/containerd/config.toml is missing"
    runner.calls.clear()
    finished, events = _run_phases(cluster, tmp_path, runner, ("preflight", "os_prep", "container_runtime"))
    assert finished.status == "ok"
    assert _limits(runner) == {"os_prep": ("gpu02",), "container_runtime": ("cpu01",),
                               "preflight": ("cpu01", "gpu02")}, _limits(runner)
    started = {e.phase: e for e in events if isinstance(e, PhaseStarted)}
    assert started["os_prep"].hosts == ["gpu02"] and started["os_prep"].reason.endswith("; only on gpu02")
    # Recorded on the hosts it ran on; the others kept theirs: the next run asks and runs nothing.
    runner.calls.clear()
    assert _run_phases(cluster, tmp_path, runner, ("preflight", "os_prep", "container_runtime"))[0].phases_run == []


def test_a_repair_also_runs_on_the_hosts_its_plays_pick_by_position(cluster, tmp_path):
    # workers_join makes the join's credentials on control_plane[0]: a worker's repair needs it.
    names = ("preflight", "workers_join", "control_plane_join")
    runner = RunnerDouble()
    _run_phases(cluster, tmp_path, runner, names)
    runner.hosts.broken[("gpu02", "workers_join")] = "kubelet is inactive"
    runner.hosts.broken[("cp03", "control_plane_join")] = "/etc/kubernetes/kubelet.conf is missing"
    runner.calls.clear()
    finished, events = _run_phases(cluster, tmp_path, runner, names)
    assert finished.status == "ok"
    limits = _limits(runner)
    assert set(limits["workers_join"]) == {"cp01", "gpu02"}, limits
    assert set(limits["control_plane_join"]) == {"cp01", "cp03"}, limits
    reason = next(e.reason for e in events if isinstance(e, PhaseStarted) and e.phase == "workers_join")
    assert reason == "gpu02: kubelet is inactive; only on gpu02 (and cp01, which it needs)"


def test_a_phase_runs_whole_when_every_host_lost_it_or_it_repairs_only_whole(cluster, tmp_path):
    runner = RunnerDouble()
    _run_phases(cluster, tmp_path, runner, ("preflight", "os_prep", "cni"))
    hosts = [p for p in UP if p.name == "os_prep"][0].hosts_in(cluster)
    for host in hosts:
        runner.hosts.broken[(host, "os_prep")] = "/etc/sysctl.d/90-gpuboot.conf is missing"
    # The pod network: one node's routes name every node's pod CIDR, so it runs everywhere.
    runner.hosts.broken[("gpu01", "cni")] = "/etc/cni/net.d/10-gpuboot-bridge.conflist is missing"
    runner.calls.clear()
    finished, events = _run_phases(cluster, tmp_path, runner, ("preflight", "os_prep", "cni"))
    assert finished.phases_run == ["preflight", "os_prep", "cni"]
    assert _limits(runner) == {"preflight": (), "os_prep": (), "cni": ()}
    assert not any("only on" in e.reason for e in events if isinstance(e, PhaseStarted))


def test_a_host_that_did_not_answer_the_probe_makes_the_whole_phase_run():
    from gpuboot.phases.convergence import Probe
    probe = Probe({"os_prep": {"a": [], "b": ["gone"]}}, unreachable={"c"})
    assert probe.drifted("os_prep", ["a", "b"]) == ["b"]
    assert probe.drifted("os_prep", ["a", "b", "c"]) is None
    assert probe.drifted("os_prep", ["a", "b", "d"]) is None  # not asked


def test_plan_says_where_a_repair_of_a_converged_phase_would_run(cluster, tmp_path):
    from gpuboot.phases.planning import describe
    names = ("os_prep", "workers_join", "cni")
    _run_phases(cluster, tmp_path, RunnerDouble(), names)
    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)
    actions = {row["phase"]: row["action"] for row in describe(cluster, [p for p in UP if p.name in names], state)}
    assert actions["os_prep"].endswith("; else on the hosts that lost it"), actions
    assert actions["workers_join"].endswith("; else on the hosts that lost it and cp01, which it needs"), actions
    assert actions["cni"].endswith("; else on every host (one host's result depends on every other's)"), actions


@pytest.mark.parametrize(("nodes", "forks"), [(1, 1), (5, 5), (50, 50), (256, 256), (2000, 256)])
def test_ansible_gets_one_fork_per_node_up_to_the_cap(nodes, forks):
    # fewer forks than hosts makes Ansible poll for a free worker: CPU the control machine pays per node
    assert forks_for(SimpleNamespace(nodes=[object()] * nodes)) == forks


def test_every_playbook_of_a_run_gets_the_forks_of_the_cluster(cluster, tmp_path):
    runner = RunnerDouble()
    run(cluster, tmp_path, runner)
    assert runner.calls and {call.forks for call in runner.calls} == {len(cluster.nodes)}


def test_node_local_phases_go_to_the_executors_with_their_hosts_named(cluster, tmp_path):
    """With gpuboot.executors, os_prep's playbook goes to the split runner with every host it
    runs on named (each share is its hosts); preflight (it compares hosts) and the bookkeeping
    stay on the control machine."""
    from gpuboot.config.model import Executor
    settings = cluster.settings.model_copy(update={"executors": [Executor(name="ex1", address="192.0.2.1")]})
    cluster = cluster.model_copy(update={"settings": settings})
    runner = RunnerDouble()
    split = RunnerDouble(hosts=runner.hosts)
    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)
    events = []
    engine = Engine(cluster, state, RunOptions(), events.append, runner=runner, split=split)
    assert engine.run(PHASES).status == "ok"
    started = next(e for e in events if isinstance(e, PhaseStarted) and e.phase == "os_prep")
    assert started.reason.endswith(f"; on the executors ex1 ({len(started.hosts)} hosts)"), started.reason
    assert [c.playbook.name for c in split.calls] == ["os_prep.yml"]
    os_prep = next(p for p in UP if p.name == "os_prep")
    assert split.calls[0].limit == tuple(os_prep.hosts_in(cluster))
    assert "os_prep.yml" not in [c.playbook.name for c in runner.calls]
    assert "preflight.yml" in [c.playbook.name for c in runner.calls]
