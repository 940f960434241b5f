"""`gpuboot node add|remove`: which phases run and on which hosts, decided before anything runs,
and the engine's --limit reaching ansible-playbook for the phases (never for its own state
runs). The lab test adds and removes real nodes."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuboot import nodes
from gpuboot.config.loader import load_cluster
from gpuboot.errors import UsageError
from gpuboot.events import PhaseStarted
from gpuboot.phases.engine import Engine, RunOptions
from gpuboot.state import ClusterState
from tests.doubles.runner_double import RunnerDouble

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(ROOT / "inventories" / "sample" / "inventory.yml")


def names(change) -> list[str]:
    return [p.name for p in change.phases]


def test_adding_a_worker_touches_it_and_the_first_control_plane(cluster):
    change = nodes.add(cluster, ("gpu02",))
    assert names(change) == ["preflight", "os_prep", "container_runtime", "kube_packages", "workers_join", "cni"]
    assert change.limit == ("cp01", "gpu02")
    assert "ha_endpoint" not in change.unlimited


def test_adding_a_control_plane_rebuilds_every_control_planes_endpoint(cluster):
    change = nodes.add(cluster, ("cp03",))
    assert names(change) == ["preflight", "os_prep", "container_runtime", "kube_packages", "ha_endpoint",
                             "control_plane_join", "cni"]
    assert change.limit == ("cp01", "cp03") and "ha_endpoint" in change.unlimited


def test_refusals(cluster):
    with pytest.raises(UsageError, match="first control plane"):
        nodes.add(cluster, ("cp01",))
    with pytest.raises(UsageError, match="nosuch"):
        nodes.add(cluster, ("gpu01", "nosuch"))
    with pytest.raises(UsageError, match="nosuch"):
        nodes.remove(cluster, "nosuch", reachable=True)


def test_removal_runs_from_another_control_plane(cluster, tmp_path):
    assert nodes.remove(cluster, "cp01", reachable=True)[0] == "cp02"
    via, data = nodes.remove(cluster, "gpu01", reachable=False)
    assert via == "cp01" and data == {"node": "gpu01", "via": "cp01", "reachable": False, "control_plane": False}
    (tmp_path / "one.yml").write_text(
        "all:\n  vars:\n    gpuboot:\n      cluster_name: one\n      release: k8s-1.36\n"
        "      control_plane: {vip: 10.0.0.100, interface: eth0}\n"
        "  children:\n    control_plane:\n      hosts:\n        solo: {ansible_host: 10.0.0.1}\n")
    with pytest.raises(UsageError, match="only control plane"):
        nodes.remove(load_cluster(str(tmp_path / "one.yml")), "solo", reachable=True)


def test_the_limit_reaches_the_phases_not_the_state_runs(cluster, tmp_path):
    change = nodes.add(cluster, ("gpu02",))
    runner = RunnerDouble()
    events = []
    state = ClusterState.for_cluster(tmp_path, cluster.settings.cluster_name)
    options = RunOptions(command="node add", limit=change.limit, unlimited=("cni",))
    finished = Engine(cluster, state, options, events.append, runner=runner).run(list(change.phases))
    assert finished.status == "ok"
    started = {e.phase: e.hosts for e in events if isinstance(e, PhaseStarted)}
    # The first control plane is in the limit (it hands out the join credentials).
    assert started["os_prep"] == ["cp01", "gpu02"] and set(started["workers_join"]) == {"cp01", "gpu02"}
    assert set(started["cni"]) == set(next(p for p in change.phases if p.name == "cni").hosts_in(cluster))
    by_ident = {r.ident: r for r in runner.calls}
    assert by_ident["os_prep"].limit == ("cp01", "gpu02") and by_ident["cni"].limit == ()
    assert all(r.limit == () for r in runner.calls if r.ident.startswith("state-"))
