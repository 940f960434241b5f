"""`gpuboot upgrade` decided before anything changes: the path (tested, one minor, never
down), the order and the batches (Ansible's own host order, as `serial` will cut it), the
printed plan (golden), and the judgement of the checks the hosts answer (API objects as the
API server returns them; the lab upgrade test runs them against a real cluster)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.errors import UpgradeRefused, UsageError
from gpuboot.upgrade import DRIVER_TIMEOUT_FLOOR, DRIVER_TIMEOUT_PER_ROUND, check_path, plan_upgrade, worker_batches
from tests.support.modules import load_module

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "inventories" / "sample" / "inventory.yml"
GOLDEN = ROOT / "tests" / "golden" / "upgrade" / "sample-plan.txt"
check = load_module("gpuboot_upgrade_check")


def release(name: str, version: str, upgrades_from: list[str]) -> matrix.Release:
    return matrix.Release.model_validate({"name": name, "kubernetes": {"version": version},
                                          "containerd": {"version": "1.7.24"}, "os": {},
                                          "upgrades_from": upgrades_from})


def test_only_a_tested_path_of_one_minor_upwards():
    check_path(release("a", "v1.36.3", []), release("b", "v1.37.2", ["a"]))
    with pytest.raises(UpgradeRefused, match="skips a minor"):
        check_path(release("a", "v1.33.2", []), release("c", "v1.37.2", ["a"]))
    with pytest.raises(UpgradeRefused, match="downgrade"):
        check_path(release("b", "v1.37.2", []), release("a", "v1.36.3", ["b"]))
    # Patch numbers compare as numbers: .10 is newer than .4.
    check_path(release("a", "v1.36.3", []), release("p", "v1.36.10", ["a"]))
    with pytest.raises(UpgradeRefused, match="downgrade"):
        check_path(release("p", "v1.36.10", []), release("a", "v1.36.3", ["p"]))
    with pytest.raises(UpgradeRefused, match="already"):
        check_path(release("a", "v1.36.3", []), release("a", "v1.36.3", ["a"]))
    with pytest.raises(UpgradeRefused, match="not a tested upgrade path") as refused:
        check_path(release("x", "v1.36.1", []), release("b", "v1.37.2", ["a"]))
    assert "start from: a" in refused.value.hint


def test_batches_canary_first_then_counts_or_shares():
    workers = [f"w{i}" for i in range(1, 8)]
    assert worker_batches(workers, 1, "2") == [["w1"], ["w2", "w3"], ["w4", "w5"], ["w6", "w7"]]
    assert worker_batches(workers, 1, "50%") == [["w1"], ["w2", "w3", "w4", "w5"], ["w6", "w7"]]
    assert worker_batches(workers, 0, "100%") == [workers]
    assert worker_batches(workers, 2, "1%") == [["w1", "w2"]] + [[w] for w in workers[2:]]
    assert worker_batches([], 1, "20%") == []
    for bad in ("0", "x", "-1", "2.5", "%"):
        with pytest.raises(UsageError):
            worker_batches(workers, 1, bad)


def test_batches_follow_ansibles_order_for_an_ini_inventory_with_ranges(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "hosts.ini").write_text(
        "[control_plane]\ncp[1:3].lab.internal\n\n[gpu_workers]\ngpu[01:05].lab.internal\n\n"
        "[workers:children]\ngpu_workers\n")
    (tmp_path / "group_vars" / "all.yml").write_text(
        "gpuboot:\n  cluster_name: ini\n  release: k8s-1.36\n"
        "  control_plane: {vip: 10.0.0.100, interface: eth0}\n")
    cluster = load_cluster(str(tmp_path / "hosts.ini"))
    plan = plan_upgrade(cluster, "k8s-1.37", canary=1, batch="2")
    assert plan.first == "cp1.lab.internal"
    assert plan.other_control_planes == ("cp2.lab.internal", "cp3.lab.internal")
    assert plan.batches == (("gpu01.lab.internal",), ("gpu02.lab.internal", "gpu03.lab.internal"),
                            ("gpu04.lab.internal", "gpu05.lab.internal"))
    data = plan.as_data()
    assert data["batch_sizes"] == [1, 2, 2] and data["version"] == "v1.37.2" and data["from_version"] == "v1.36.3"


def test_plan_of_the_sample_matches_golden_and_touches_nothing(capsys):
    assert run(["upgrade", str(SAMPLE), "--to", "k8s-1.37", "--plan"]) == 0
    said = capsys.readouterr().out
    if os.environ.get("GPUBOOT_UPDATE_GOLDEN"):
        GOLDEN.write_text(said)
    assert said == GOLDEN.read_text()
    assert run(["upgrade", str(SAMPLE), "--to", "k8s-1.37", "--plan", "--output", "json", "--canary", "0",
                "--batch", "100%"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["upgrade"]["batches"] == [["cpu01", "gpu01", "gpu02"]]
    # The sample's precompiled drivers move from branch 580 to 595: one driver step per GPU node.
    assert [s["node"] for s in data["steps"]] == ["cp01", "cp01", "cp01", "cp02", "cp03", "cpu01", "gpu01", "gpu02",
                                                  "gpu01", "gpu02"]


def test_refusals_name_the_reason_and_exit_7(capsys):
    assert run(["upgrade", str(SAMPLE), "--to", "k8s-1.36", "--plan"]) == 7
    assert "already Kubernetes v1.36.3" in capsys.readouterr().err
    assert run(["upgrade", str(SAMPLE), "--to", "k8s-9.99", "--plan"]) == 2
    assert "not in the version matrix" in capsys.readouterr().err
    assert run(["upgrade", str(SAMPLE), "--to", "k8s-1.37", "--plan", "--batch", "0"]) == 2


def node(name: str, version: str, ready: bool = True, cordoned: bool = False) -> dict:
    return {"metadata": {"name": name}, "spec": {"unschedulable": True} if cordoned else {},
            "status": {"nodeInfo": {"kubeletVersion": version},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name: str, node_name: str, image: str, ready: bool = True, waiting: str | None = None) -> dict:
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {"metadata": {"name": name, "namespace": "kube-system"},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": image}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "c", "ready": ready, "state": state, "restartCount": 4 if waiting else 0}]}}


def test_before_checks_versions_skew_and_an_upgrade_in_progress():
    a, b = "v1.36.3", "v1.37.2"
    api = [pod("kube-apiserver-cp1", "cp1", f"mirror:5000/registry.k8s.io/kube-apiserver:{a}")]
    assert check.version_problems([node("cp1", a), node("w1", a)], api, ["cp1", "w1"], a, b, False) == []
    problems = check.version_problems([node("cp1", a), node("w1", "v1.33.9", ready=False)], api,
                                      ["cp1", "w1", "w2"], a, b, False)
    assert any("w2 is in the inventory but not in the cluster" in p for p in problems)
    assert any("w1 is not Ready" in p for p in problems)
    assert any("w1 runs kubelet v1.33.9" in p for p in problems)
    moved = check.version_problems([node("cp1", b), node("w1", a)], api, ["cp1", "w1"], a, b, False)
    assert moved == ["an upgrade to v1.37.2 is in progress (cp1 kubelet already there): continue it with --resume"]
    assert check.version_problems([node("cp1", b), node("w1", a)], api, ["cp1", "w1"], a, b, True) == []
    done = [pod("kube-apiserver-cp1", "cp1", f"m/registry.k8s.io/kube-apiserver:{b}")]
    assert check.version_problems([node("cp1", b), node("w1", b)], done, ["cp1", "w1"], a, b, False) == [
        "the cluster already runs v1.37.2: set gpuboot.release in the inventory to the release it runs (or continue "
        "a stopped upgrade with --resume)"]
    # A run stopped after Kubernetes (at the GPU drivers) resumes: the node steps only gate.
    assert check.version_problems([node("cp1", b), node("w1", b)], done, ["cp1", "w1"], a, b, True) == []


class FlakyApi:
    """A Kube whose `kubectl get nodes` fails `failures` times (an API server restarting) first."""

    def __init__(self, failures: int) -> None:
        self.failures, self.asked = failures, 0

    def run(self, *args, **_):
        self.asked += 1
        if self.asked <= self.failures:
            return 1, "", "Unable to connect to the server: net/http: TLS handshake timeout"
        return 0, json.dumps({"items": [node("cp1", "v1.36.3")]}), ""


def test_before_asks_the_api_again_before_it_calls_it_unreachable(monkeypatch):
    clock = {"now": 0.0}
    monkeypatch.setattr(check.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(check.time, "sleep", lambda s: clock.__setitem__("now", clock["now"] + s))
    api = FlakyApi(failures=3)
    nodes, said = check.reach(api, patience=60)
    assert [n["metadata"]["name"] for n in nodes] == ["cp1"] and said is None and api.asked == 4
    # Still down after its patience: unreachable, with kubectl's own words and how long it asked.
    clock["now"] = 0.0
    down = FlakyApi(failures=100)
    nodes, said = check.reach(down, patience=60)
    assert nodes is None and "TLS handshake timeout" in said
    assert (clock["now"], down.asked) == (60.0, 21)  # every 3 s for its 60 s, no longer
    problems = check.before(FlakyApi(failures=100), {"reach": 9})
    assert problems == ["the API server does not answer through the control-plane endpoint (asked for 9 s): "
                        "Unable to connect to the server: net/http: TLS handshake timeout"]


def test_etcd_and_pdb_judgement():
    members = [{"name": "cp1"}, {"name": "cp2"}]
    assert "2 members (cp1, cp2) for 3 control planes" in check.etcd_problems(members, [], ["cp1", "cp2", "cp3"])[0]
    unhealthy = check.etcd_problems(members, [{"endpoint": "https://10.0.0.2:2379", "health": False,
                                               "error": "context deadline exceeded"}], ["cp1", "cp2"])
    assert unhealthy == ["etcd member https://10.0.0.2:2379 is unhealthy: context deadline exceeded"]
    pdbs = [{"metadata": {"namespace": "app", "name": "web"},
             "status": {"expectedPods": 1, "disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1}},
            {"metadata": {"namespace": "app", "name": "ok"}, "status": {"expectedPods": 3, "disruptionsAllowed": 1}},
            {"metadata": {"namespace": "app", "name": "empty"}, "status": {"expectedPods": 0, "disruptionsAllowed": 0}}]
    assert [p.split(" allows")[0] for p in check.pdb_problems(pdbs)] == ["PodDisruptionBudget app/web"]


def test_node_gate():
    v = "v1.37.2"
    statics = [pod(f"{c}-cp1", "cp1", f"m/registry.k8s.io/{c}:{v}") for c in check.STATIC_PODS]
    etcd = pod("etcd-cp1", "cp1", "m/registry.k8s.io/etcd:3.6.6-0")
    assert check.node_gate_problems(node("cp1", v), [*statics, etcd], v, True) == []
    old = [pod("kube-scheduler-cp1", "cp1", "m/registry.k8s.io/kube-scheduler:v1.36.3") if p["metadata"]["name"]
           == "kube-scheduler-cp1" else p for p in statics]
    problems = check.node_gate_problems(node("cp1", "v1.36.3", cordoned=True), old, v, True)
    assert "cp1 runs kubelet v1.36.3, not v1.37.2" in problems and "cp1 is still cordoned" in problems
    assert "kube-scheduler-cp1 runs v1.36.3, not v1.37.2" in problems and "etcd-cp1 is not running" in problems
    crash = pod("app-1", "w1", "img:1", ready=False, waiting="CrashLoopBackOff")
    assert check.node_gate_problems(node("w1", v), [crash], v, False) == [
        "kube-system/app-1 is crash-looping (c, 4 restarts, CrashLoopBackOff)"]
    # After the uncordon the node's pods come back: one still starting keeps the gate shut, and
    # one that stopped with an error counts before the kubelet calls it a crash loop.
    creating = pod("app-2", "w1", "img:1", ready=False, waiting="ContainerCreating")
    creating["status"]["containerStatuses"][0]["restartCount"] = 0
    unbound = {"metadata": {"name": "app-3", "namespace": "web"}, "spec": {"nodeName": "w1"},
               "status": {"phase": "Pending"}}
    exited = pod("app-4", "w1", "img:1", ready=False)
    exited["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 1, "reason": "Error"}}
    backing_off = pod("app-5", "w1", "img:1", ready=False, waiting="ImagePullBackOff")
    assert check.node_gate_problems(node("w1", v), [creating, unbound, exited, backing_off], v, False) == [
        "kube-system/app-2 is still starting (c: ContainerCreating)", "web/app-3 is still starting",
        "kube-system/app-4 is crash-looping (c, 0 restarts)",
        "kube-system/app-5 is crash-looping (c, 4 restarts, ImagePullBackOff)"]
    # A finished pod, and a ready one that restarted long ago, are no problem.
    done = pod("job-1", "w1", "img:1", ready=False)
    done["status"]["phase"] = "Succeeded"
    veteran = pod("app-6", "w1", "img:1")
    veteran["status"]["containerStatuses"][0]["restartCount"] = 9
    assert check.node_gate_problems(node("w1", v), [done, veteran], v, False) == []
    # Another node's pods are not this node's business.
    assert check.node_gate_problems(node("w2", v), [crash], v, False) == []


driver = load_module("gpuboot_driver_upgrade")
MIXED_DRIVERS = ROOT / "tests" / "corpus" / "gpu" / "mixed_drivers" / "inventory.yml"


def test_gpu_drivers_move_only_where_the_operator_manages_them_and_the_release_changes_them(tmp_path, capsys):
    # The mixed-drivers fleet at the release before: a driver container on h100-02, precompiled
    # on h100-01 (1.36 -> 1.37 moves the branch 580 -> 595, so its tag moves too), the host's
    # on dgx-01 (never part of an upgrade).
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(MIXED_DRIVERS.read_text())
    assert "release: k8s-1.36" in inventory.read_text()
    plan = plan_upgrade(load_cluster(str(inventory)), "k8s-1.37", driver_timeout=900)
    assert [(c.node, c.kind, c.from_tag, c.to_tag) for c in plan.gpu_drivers] == [
        ("h100-01", "precompiled", "580", "595"), ("h100-02", "container", "580.178.04", "595.91.07")]
    assert plan.phases[-1] == "upgrade_gpu_driver"
    assert plan.as_data()["gpu_drivers"] == {"h100-01": "595", "h100-02": "595.91.07"}
    assert plan.as_data()["driver_timeout"] == 900
    assert run(["upgrade", str(inventory), "--to", "k8s-1.37", "--plan"]) == 0
    said = capsys.readouterr().out
    assert "h100-02  GPU driver     container driver 580.178.04 -> 595.91.07 by the GPU Operator's upgrade " \
           "controller" in said
    assert "h100-01  GPU driver" in said and "dgx-01   GPU driver" not in said
    # A release that keeps the drivers has no driver phase: k8s-1.36 over itself at a later patch.
    releases = tmp_path / "releases"
    releases.mkdir()
    same = (matrix.content.releases_dir() / "k8s-1.36.yml").read_text()
    (releases / "k8s-1.36.yml").write_text(same)
    (releases / "k8s-1.36-patch.yml").write_text(
        same.replace("name: k8s-1.36", "name: k8s-1.36-patch").replace("v1.36.3", "v1.36.4")
        .replace("upgrades_from: []", "upgrades_from: [k8s-1.36]"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matrix.content, "releases_dir", lambda: releases)
        assert "upgrade_gpu_driver" not in plan_upgrade(load_cluster(str(inventory)), "k8s-1.36-patch").phases
    with pytest.raises(UsageError, match="driver-timeout"):
        plan_upgrade(load_cluster(str(inventory)), "k8s-1.37", driver_timeout=5)


# NVIDIA's upgrade controller does not watch pods: after restarting a node's driver it looks
# again on its two-minute requeue (seen against the real controller, test_real_gpu_operator_pods.py),
# so a node takes two minutes at the very least, before the driver's own build and load.
CONTROLLER_FLOOR_S = 120


def test_the_default_driver_timeout_leaves_a_large_fleet_its_controller_s_floor(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(
        "gpuboot:\n  cluster_name: h200\n  release: k8s-1.36\n  control_plane: {vip: 10.0.0.100}\n"
        "  node_os: {id: ubuntu-22.04, kernels: [5.15.0-127-generic]}\n")
    (tmp_path / "group_vars" / "gpu_workers.yml").write_text(
        "gpuboot_node: {gpu: {model: H200-SXM-141GB, count: 8, driver: container}}\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[control_plane]\ncp[1:3]\n[gpu_workers]\ngpu[01:50]\n[workers:children]\ngpu_workers\n")
    plan = plan_upgrade(load_cluster(str(inventory)), "k8s-1.37")
    assert len(plan.gpu_drivers) == 50
    floor = CONTROLLER_FLOOR_S * len(plan.gpu_drivers)  # one node at a time, gpuboot's maxParallelUpgrades
    assert plan.driver_timeout >= floor, f"{plan.driver_timeout} s for {len(plan.gpu_drivers)} nodes, one at a time"
    assert plan.driver_timeout == 50 * DRIVER_TIMEOUT_PER_ROUND
    # Four at a time: rounds of four, each given its share.
    (tmp_path / "group_vars" / "all.yml").write_text(
        (tmp_path / "group_vars" / "all.yml").read_text() + "  gpu_operator: {upgrade_max_parallel: 4}\n")
    faster = plan_upgrade(load_cluster(str(inventory)), "k8s-1.37")
    assert faster.driver_timeout == 13 * DRIVER_TIMEOUT_PER_ROUND >= CONTROLLER_FLOOR_S * 13
    # A small fleet keeps the floor; a timeout given on the command line is kept as given.
    inventory.write_text("[control_plane]\ncp[1:3]\n[gpu_workers]\ngpu[01:02]\n[workers:children]\ngpu_workers\n")
    assert plan_upgrade(load_cluster(str(inventory)), "k8s-1.37").driver_timeout == DRIVER_TIMEOUT_FLOOR
    assert plan_upgrade(load_cluster(str(inventory)), "k8s-1.37", driver_timeout=600).driver_timeout == 600


def gpu_node(name: str, state: str = "", skip: bool = False) -> dict:
    labels = {"nvidia.com/gpu-driver-upgrade-state": state} if state else {}
    if skip:
        labels["nvidia.com/gpu-driver-upgrade.skip"] = "true"
    return {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": {}}


def driver_pod(node_name: str, tag: str, ready: bool = True, waiting: str | None = None, app: str =
               "nvidia-driver-daemonset") -> dict:
    found = pod(f"{app}-{node_name}", node_name, f"nvcr.io/nvidia/driver:{tag}", ready=ready, waiting=waiting)
    found["metadata"]["labels"] = {"app": app}
    return found


def test_driver_upgrade_judgement_follows_the_operators_labels_and_the_driver_pod():
    wanted = {"g1": "570.172.08", "g2": "570.172.08", "g3": "570"}
    nodes = [gpu_node("g1", "upgrade-done"), gpu_node("g2", "pod-restart-required"), gpu_node("g3", "upgrade-done")]
    pods = [driver_pod("g1", "570.172.08-ubuntu22.04"), driver_pod("g2", "570.158.01-ubuntu22.04"),
            # A precompiled driver of NVIDIADriver objects: <branch>-<kernel>-<os tag>.
            {**driver_pod("g3", "570-5.15.0-1048-nvidia-ubuntu22.04", app="nvidia-gpu-driver-ubuntu22.04-7c6d")}]
    found = driver.judge(nodes, pods, wanted)
    assert found["g1"] == ("done", "driver 570.172.08-ubuntu22.04 ready")
    assert found["g2"][0] == "waiting" and "state pod-restart-required" in found["g2"][1] and \
        "runs 570.158.01-ubuntu22.04" in found["g2"][1]
    assert found["g3"][0] == "done"
    # Still at the old driver although the operator says done (it has not seen the new version
    # yet): waiting, never done. A tag that only starts alike is not the version.
    assert driver.judge([gpu_node("g1", "upgrade-done")], [driver_pod("g1", "570.158.01-ubuntu22.04")],
                        {"g1": "570.158"})["g1"][0] == "waiting"
    # The new pod exists but is not ready yet.
    assert driver.judge([gpu_node("g1", "validation-required")], [driver_pod("g1", "570.172.08-ubuntu22.04",
                                                                             ready=False)], wanted)["g1"][0] == "waiting"
    # Failed: named with the driver pod's own reason; skipped: reported, not waited for.
    failed = driver.judge([gpu_node("g2", "upgrade-failed"), gpu_node("g1", skip=True)],
                          [driver_pod("g2", "570.172.08-ubuntu22.04", ready=False, waiting="CrashLoopBackOff"),
                           driver_pod("g1", "570.158.01-ubuntu22.04")], wanted)
    assert failed["g2"] == ("failed", "nvidia.com/gpu-driver-upgrade-state=upgrade-failed; driver pod "
                                      "nvidia-driver-daemonset-g2: CrashLoopBackOff")
    assert failed["g1"][0] == "skipped" and "keeps driver 570.158.01-ubuntu22.04" in failed["g1"][1]
    assert driver.judge([], [], {"g9": "1"})["g9"] == ("waiting", "not in the cluster")
    message = driver.failure_message(failed, 12, 600, "gpu-operator", "gpuboot upgrade inv.yml --to k8s-1.37 --resume")
    assert message.startswith("the GPU Operator's driver upgrade failed on g2:")
    assert "nvidia.com/gpu-driver-upgrade-state=upgrade-required to retry" in message
    assert message.endswith("gpuboot upgrade inv.yml --to k8s-1.37 --resume")
    late = driver.failure_message({"g2": found["g2"], "g1": found["g1"]}, 601, 600, "gpu-operator", "R")
    assert "not all upgraded after 601 s (timeout 600 s)" in late and "- g2: state pod-restart-required" in late
    assert "- g1" not in late


def test_each_node_takes_the_target_containerd_inside_its_drain():
    from gpuboot.upgrade import UpgradePlan
    base = dict(cluster="c", from_release="a", to_release="b", from_version="v1.36.3", to_version="v1.37.2",
                first="cp1", other_control_planes=(), batches=(), canary=0, drain_timeout=300, gate_timeout=300,
                resume=False)
    moved = UpgradePlan(**base, from_containerd="2.3.7", to_containerd="2.4.2").node_steps()
    assert moved[0].startswith("drain") and moved[1].startswith("containerd 2.3.7 -> 2.4.2 from the mirror (held)")
    assert moved[2].startswith("kubeadm v1.37.2")  # before kubeadm: the node is drained already
    kept = UpgradePlan(**base, from_containerd="2.4.2", to_containerd="2.4.2").node_steps()
    assert kept[1] == "containerd stays 2.4.2 (package and configuration checked)"
    # From the matrix: k8s-1.36 -> k8s-1.37 moves containerd one minor, as containerd supports.
    plan = plan_upgrade(load_cluster(str(SAMPLE)), "k8s-1.37")
    assert (plan.from_containerd, plan.to_containerd) == (matrix.load("k8s-1.36").containerd.version,
                                                          matrix.load("k8s-1.37").containerd.version)
    old, new = (tuple(int(p) for p in v.split(".")[:2]) for v in (plan.from_containerd, plan.to_containerd))
    assert new[0] == old[0] and new[1] - old[1] in (0, 1), "containerd supports upgrades one minor at a time"
