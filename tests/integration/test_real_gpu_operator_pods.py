"""NVIDIA's real GPU Operator with its operands' pods (issue 29, points 3 and 4): the operator
built from its source tree at the tag the release pins (as test_real_gpu_operator.py runs it)
on a real API server where the real DaemonSet controller and scheduler make and bind the pods
of the DaemonSets it deploys, and a TEST DOUBLE of the nodes' kubelets (`tests/doubles/kubelet_double.py`)
reports them running, or one container crashing. gpuboot's values go through the real chart
and are applied as the phase applies them. Held against gpuboot:
- readiness: the ClusterPolicy status the real operator writes passes the phase's wait
  (roles/gpu_operator/tasks/ready.yml) and validate's operand check; one operand that cannot
  start on one node makes the operator say notReady, and both name that node, pod and reason;
- the driver upgrade: the operator's upgrade controller (k8s-operator-libs' state machine)
  moves each node's driver after the ClusterPolicy (or, where nodes differ in driver kind, each
  NVIDIADriver) names the release's, walking the documented states one node at a time, and the
  phase's wait (gpuboot_driver_upgrade) follows it to the end; a driver that cannot load makes
  the controller mark its node upgrade-failed, and the wait stops there, naming it.

The cases: tests/corpus/gpu/time_slicing (three nodes, drivers built on the nodes) and, for the
upgrade, mixed_drivers (precompiled, built on the node, the host's), each started at the
drivers the previous release pins. The upgrade controller does not watch pods: after it
restarts a node's driver it looks again on its own two-minute requeue, so each node takes
about two minutes, as in a real cluster. Skipped, naming what to bring, without the source
tree, root or unshare."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.upgrade import driver_changes
from tests.doubles.kubelet_double import (
    BROKEN,
    Background,
    KubeletDouble,
    api_with_pod_controllers,
    operator_says_not_ready,
    pods_in,
    policy_state,
    ready_node,
    remove_workloads,
    wait_until,
)
from tests.integration.test_addon_objects_dry_run import render_through_real_chart
from tests.integration.test_addon_waits import wait as addon_wait
from tests.integration.test_real_gpu_operator import gpu_nodes, operator_image, start_operator  # noqa: F401
from tests.support.apiserver import ApiServer
from tests.support.modules import load_module

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
pod_ready = load_module("gpuboot_cluster_check").pod_ready  # the product's own readiness, as validate reads it
# Drivers built on the nodes, in the ClusterPolicy; and driver kinds mixed across nodes, one
# NVIDIADriver object per kind (precompiled, built on the node; a preinstalled one is the host's).
CASES = {name: ROOT / "tests" / "corpus" / "gpu" / name / "inventory.yml" for name in ("time_slicing", "mixed_drivers")}
FROM_RELEASE = "k8s-1.35"  # the release before the case's: its driver is what the nodes run first
NAMESPACE = "gpu-operator"
STATE = "nvidia.com/gpu-driver-upgrade-state"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
CLUSTER_POLICY = "clusterpolicies.nvidia.com"
# The states k8s-operator-libs walks a node through, in order; drain-required is passed over
# when the policy asks for no drain, as gpuboot's does not.
WALK = ["upgrade-required", "cordon-required", "wait-for-jobs-required", "pod-deletion-required",
        "pod-restart-required", "validation-required", "uncordon-required", "upgrade-done"]


class StateWatch(Background):
    """Every upgrade state each node's label takes, in order, from a watch on the Nodes (a
    poll would miss the states the controller passes within one reconcile), and the most nodes
    in flight (cordoned for their upgrade, up to uncordon) at once."""

    def __init__(self, api: ApiServer, nodes: list[str]):
        super().__init__()
        self.nodes = nodes
        self.history: dict[str, list[str]] = defaultdict(list)
        self.most_in_flight = 0
        self._listed = threading.Event()
        self._process = subprocess.Popen(
            [str(api.bin_dir / "kubectl"), "--kubeconfig", str(api.kubeconfig), "get", "nodes", "--watch", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def __enter__(self):
        # The watch's first objects are the Nodes as listed: a change made before that list
        # is read would be taken for the first state. So nothing starts until every node is seen.
        super().__enter__()
        if not self._listed.wait(60):
            self.__exit__(None, None, None)
            raise AssertionError(f"kubectl's watch did not list the nodes {self.nodes} within 60 s")
        return self

    def _halt(self) -> None:
        self._process.terminate()
        self._process.wait(10)

    def _run(self) -> None:
        decoder, buffer, now = json.JSONDecoder(), "", {}
        for line in self._process.stdout:
            buffer += line
            try:
                node, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                continue  # an object not yet whole
            buffer = buffer.lstrip()[end:]
            name = node["metadata"]["name"]
            state = (node["metadata"].get("labels") or {}).get(STATE, "")
            if name in self.nodes and state and (not self.history[name] or self.history[name][-1] != state):
                self.history[name].append(state)
            now[name] = state
            if all(n in now for n in self.nodes):
                self._listed.set()
            self.most_in_flight = max(self.most_in_flight, sum(s in WALK[1:-1] for s in now.values()))


RESUME = "gpuboot upgrade inventory.yml --to k8s-1.37 --resume"


def follow(api: ApiServer, tmp_path: Path, namespace: str, nodes: dict[str, str],
           timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """The phase's wait, as playbooks/upgrade_gpu_driver.yml runs it (its task and arguments read
    from the playbook), in the real ansible-playbook with the real kubectl; its report is kept
    in followed.json."""
    phase = yaml.safe_load((ROOT / "playbooks" / "upgrade_gpu_driver.yml").read_text())
    block = next(t for t in phase[0]["tasks"] if "block" in t)["block"]
    task = next(t for t in block if "gpuboot_driver_upgrade" in t)
    args = {**task["gpuboot_driver_upgrade"], "kubeconfig": str(api.kubeconfig), "namespace": namespace,
            "nodes": nodes, "timeout": timeout, "poll": 1, "resume": RESUME}
    playbook = tmp_path / "follow.yml"
    playbook.write_text(yaml.safe_dump([{"name": "follow", "hosts": "localhost", "gather_facts": False,
                                         "tasks": [{"name": task["name"], "gpuboot_driver_upgrade": args,
                                                    "register": "followed"},
                                                   {"name": "keep", "ansible.builtin.copy": {
                                                       "content": "{{ followed | to_json }}",
                                                       "dest": str(tmp_path / "followed.json"), "mode": "0600"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LIBRARY=str(ROOT / "playbooks" / "library"),
               ANSIBLE_MODULE_UTILS=str(ROOT / "playbooks" / "module_utils"), ANSIBLE_NOCOLOR="1",
               PATH=f"{api.bin_dir}:{os.environ['PATH']}",
               # ansible.cfg's fact cache path is relative to the file, not to the working directory.
               ANSIBLE_CACHE_PLUGIN="memory")
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", json.dumps({"ansible_python_interpreter": sys.executable}), str(playbook)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout + 120)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with api_with_pod_controllers(tmp_path_factory.mktemp("operator-pods-api")) as server:
        yield server


def driver_tag(release: str, kind: str) -> str:
    """How a release's driver image tag starts for a kind: the version built on the node, the
    branch of a precompiled one."""
    gpu = matrix.load(release).model_extra["gpu_operator"]
    return str(gpu["driver_branch" if kind == "precompiled" else "driver_version"])


def with_drivers(objects: list[dict], tag: Callable[[str], str]) -> list[dict]:
    """The ClusterPolicy, and the NVIDIADriver objects where nodes differ in driver kind, with
    each driver at `tag(kind)`."""
    changed = json.loads(json.dumps(objects))
    drivers = [o for o in changed if o["kind"] == "NVIDIADriver"]
    for spec in [d["spec"] for d in drivers] or [o["spec"]["driver"] for o in changed if o["kind"] == "ClusterPolicy"]:
        spec["version"] = tag("precompiled" if spec.get("usePrecompiled") else "container")
    return changed


def apply_policy(api: ApiServer, objects: list[dict]) -> None:
    """As the phase applies them: server-side, as gpuboot."""
    api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=yaml.safe_dump_all(objects))


def driver_pods(api: ApiServer) -> dict[str, dict]:
    pods = pods_in(api, NAMESPACE, "-l", "app.kubernetes.io/component=nvidia-driver")
    return {p["spec"]["nodeName"]: p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get(
        "deletionTimestamp")}


@dataclass
class OperatorLab:
    cluster: object
    objects: list[dict]  # the ClusterPolicy and any NVIDIADriver objects, at the case's release
    changes: dict        # GPU node -> the DriverChange from the previous release to this one
    log: Path            # the operator's output
    kubelets: KubeletDouble


@pytest.fixture
def operator_lab(request, operator_image, api, helm, tmp_path):  # noqa: F811 (fixtures by name)
    """The case (time_slicing unless parametrized) rendered through the real chart and applied
    as the phase applies it, its GPU nodes Ready, the operator reconciling and each node's
    driver at the previous release's, upgrade-done."""
    binary, opt = operator_image
    rendered = render_through_real_chart(CASES[getattr(request, "param", "time_slicing")], "gpu-operator",
                                         "gpu_operator", helm, tmp_path)
    cluster, addon, objects = rendered.cluster, rendered.addon, rendered.objects
    api.apply_crds(objects)
    api.clean_slate(NAMESPACE, "clusterpolicies.nvidia.com,nvidiadrivers.nvidia.com,nodes", addon / "namespace.yaml")
    for name, labels in gpu_nodes(cluster).items():
        ready_node(api, name, labels)
    for file in ("device-plugin-config.yaml", "mig-parted-config.yaml", "node-labels.yaml"):
        if (addon / file).is_file():
            api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", str(addon / file))
    drivers = addon / "nvidia-drivers.yaml"
    ours = [o for o in objects if o["kind"] == "ClusterPolicy"] + (
        [d for d in yaml.safe_load_all(drivers.read_text()) if d] if drivers.is_file() else [])
    changes = {c.node: c for c in driver_changes(cluster, matrix.load(FROM_RELEASE),
                                                 matrix.load(cluster.settings.release))}
    apply_policy(api, with_drivers(ours, lambda kind: driver_tag(FROM_RELEASE, kind)))

    log = tmp_path / "operator.log"
    with log.open("w") as out, KubeletDouble(api, NAMESPACE) as kubelets:
        operator = start_operator(binary, opt, api, objects, out)
        try:
            def drivers_up() -> bool:
                pods = driver_pods(api)
                return all(name in pods and image_tag(pods[name]).startswith(f"{change.from_tag}-")
                           and pod_ready(pods[name]) for name, change in changes.items())

            def settled() -> bool:
                states = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(STATE)
                          for n in json.loads(api.kubectl("get", "nodes", "-o", "json").stdout)["items"]}
                return drivers_up() and all(states.get(name) == "upgrade-done" for name in changes)

            # The first reconcile deploys; the upgrade controller marks in-sync nodes done on its
            # next look, which its two-minute requeue brings. Here, in setting up only, it is made
            # to look at once through an event it watches: NVIDIA's skip label put on one node as
            # "false" (which skips nothing) and taken off again. The tests' walks are not hurried.
            wait_until("every node's driver pod at the previous release's, ready", drivers_up, 300, log)
            nudged = sorted(changes)[0]
            api.kubectl("label", "node", nudged, f"{SKIP}=false")
            wait_until("every node's driver at the previous release's, upgrade-done", settled, 300, log)
            api.kubectl("label", "node", nudged, f"{SKIP}-")
            yield OperatorLab(cluster, ours, changes, log, kubelets)
        finally:
            operator.terminate()
            operator.wait(30)
            remove_workloads(api, NAMESPACE, log)
    assert not kubelets.errors, kubelets.errors


def image_tag(pod: dict) -> str:
    return pod["spec"]["containers"][0]["image"].rsplit(":", 1)[1]


def test_the_real_operators_readiness_is_what_the_phase_waits_for_and_a_broken_operand_is_named(
        operator_lab, api, tmp_path, monkeypatch):
    cluster, log, kubelets = operator_lab.cluster, operator_lab.log, operator_lab.kubelets
    plan = cluster.gpu_plan.as_data()
    variables = {"gpu_operator_kubeconfig": str(api.kubeconfig), "gpu_operator_plan": plan,
                 "gpu_operator_ready_timeout": 120}
    ok = addon_wait(api, tmp_path, "gpu_operator", variables)
    assert ok.returncode == 0, f"{ok.stdout[-3000:]}\noperator: {log.read_text()[-3000:]}"
    monkeypatch.setenv("PATH", f"{api.bin_dir}:{os.environ['PATH']}")
    check = load_module("gpuboot_cluster_check")
    rows = check.check_operator(check.Kube(str(api.kubeconfig)), NAMESPACE, plan["nodes"])
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]

    # The device plugin cannot start on one node: the operator, seeing its DaemonSet one short,
    # says notReady, and gpuboot names the node, the pod and why.
    victim = sorted(plan["nodes"])[1]
    operator_says_not_ready(kubelets, lambda pod, c: pod["spec"]["nodeName"] == victim
                            and c["name"] == "nvidia-device-plugin",
                            lambda: policy_state(api, CLUSTER_POLICY, "cluster-policy"), log)
    short = addon_wait(api, tmp_path, "gpu_operator", variables | {"gpu_operator_ready_timeout": 10})
    said = " ".join(short.stdout.split())
    # The real operator's Ready condition then gives the reason Error.
    assert short.returncode != 0 and "ClusterPolicy is notReady Error after 10 s" in said, short.stdout[-3000:]
    assert f"- {victim}: nvidia-device-plugin-daemonset-" in said and "CrashLoopBackOff" in said, short.stdout[-3000:]
    assert "- nvidia-device-plugin-daemonset: 3 wanted, 3 updated, 2 ready" in said, short.stdout[-3000:]
    failing = [r for r in check.check_operator(check.Kube(str(api.kubeconfig)), NAMESPACE, plan["nodes"])
               if not r["ok"]]
    assert {(r["node"], r["check"]) for r in failing} == {("-", "ClusterPolicy"),
                                                           (victim, "operand nvidia-device-plugin-daemonset")}, failing
    assert any("CrashLoopBackOff" in r["reason"] for r in failing), failing


def gpuboot_fields(api: ApiServer, node: str) -> str:
    """What gpuboot owns of a Node, as server-side apply records it (its node labels)."""
    shown = json.loads(api.kubectl("get", "node", node, "-o", "json", "--show-managed-fields").stdout)
    return json.dumps([m.get("fieldsV1", {}) for m in shown["metadata"].get("managedFields", [])
                       if m["manager"] == "gpuboot"])


@pytest.mark.parametrize("operator_lab", sorted(CASES), indirect=True)
def test_the_real_upgrade_controller_moves_every_driver_and_the_phase_follows_it(operator_lab, api, tmp_path):
    cluster, log = operator_lab.cluster, operator_lab.log
    wanted = {name: change.to_tag for name, change in operator_lab.changes.items()}
    built = sorted(name for name, node in cluster.gpu_plan.nodes.items() if node.driver != "preinstalled")
    assert sorted(wanted) == built, "every node's driver the operator manages moves with the release"
    # An operator holds one node back with NVIDIA's skip label: it keeps its driver, and is reported.
    held = sorted(wanted)[-1]
    api.kubectl("label", "node", held, f"{SKIP}=true")
    old_image = driver_pods(api)[held]["spec"]["containers"][0]["image"]
    with StateWatch(api, sorted(wanted)) as watch:
        apply_policy(api, operator_lab.objects)  # what the phase's apply does: this release's values
        followed = follow(api, tmp_path, NAMESPACE, wanted, timeout=240 * len(wanted))
    assert followed.returncode == 0, f"{followed.stdout[-4000:]}\noperator: {log.read_text()[-3000:]}"

    pods = driver_pods(api)
    nodes = {n["metadata"]["name"]: n for n in json.loads(api.kubectl("get", "nodes", "-o", "json").stdout)["items"]}
    report = json.loads((tmp_path / "followed.json").read_text())
    for name, tag in sorted(wanted.items()):
        assert tag == driver_tag(cluster.settings.release, operator_lab.changes[name].kind)
        if name == held:
            continue
        assert image_tag(pods[name]).startswith(f"{tag}-"), (name, image_tag(pods[name]))
        assert nodes[name]["metadata"]["labels"][STATE] == "upgrade-done"
        assert not nodes[name]["spec"].get("unschedulable"), f"{name} left cordoned"
        # The real controller walked each node from done through the documented states, in
        # order, once (no drain: gpuboot's policy asks for none), and uncordoned it.
        assert watch.history[name] == ["upgrade-done", *WALK], (name, watch.history[name])
        assert report["nodes"][name]["verdict"] == "done", report["nodes"][name]
        # gpuboot owns its node labels (the phase's node-labels.yaml), never cordon or upgrade state.
        owned = gpuboot_fields(api, name)
        assert "f:unschedulable" not in owned and STATE not in owned, owned
    assert pods[held]["spec"]["containers"][0]["image"] == old_image, "the held node keeps its driver"
    # A node on the host's own driver: the operator deploys it none, and the phase waits for none.
    host_driver = sorted(set(cluster.gpu_plan.nodes) - set(built))
    assert not set(host_driver) & set(pods) and not set(host_driver) & set(report["nodes"]), host_driver
    # NVIDIA's controller marks the held node upgrade-required and leaves it there, uncordoned.
    assert watch.history[held] == ["upgrade-done", "upgrade-required"], watch.history[held]
    assert not nodes[held]["spec"].get("unschedulable")
    assert report["left_alone"] == [held], report
    assert report["nodes"][held]["said"] == f"skipped ({SKIP}=true): keeps driver {image_tag(pods[held])}", \
        report["nodes"][held]
    # No more nodes at once than gpuboot's maxParallelUpgrades, which it renders on the
    # ClusterPolicy and on each NVIDIADriver (the controller reads an NVIDIADriver's own policy
    # on mixed driver kinds; the release pins operator v26.7.0, whose CRD has the field).
    policies = [o["spec"]["driver"]["upgradePolicy"] if o["kind"] == "ClusterPolicy" else o["spec"]["upgradePolicy"]
                for o in operator_lab.objects]
    limits = {p["maxParallelUpgrades"] for p in policies}
    assert len(limits) == 1, policies
    max_parallel = limits.pop()
    assert 1 <= watch.most_in_flight <= max_parallel, (watch.most_in_flight, max_parallel)


def test_a_driver_that_cannot_load_stops_the_phase_naming_the_node(operator_lab, api, tmp_path):
    log = operator_lab.log
    wanted = {name: change.to_tag for name, change in operator_lab.changes.items()}
    apply_policy(api, with_drivers(operator_lab.objects,
                                   lambda kind: f"{driver_tag(operator_lab.cluster.settings.release, kind)}-{BROKEN}"))
    started = time.monotonic()
    # What the phase's apply does, with a driver no node can load.
    followed = follow(api, tmp_path, NAMESPACE, {n: f"{t}-{BROKEN}" for n, t in wanted.items()},
                      timeout=240 * len(wanted))
    assert followed.returncode != 0, followed.stdout[-4000:]
    said = followed.stdout
    assert "the GPU Operator's driver upgrade failed on" in said, f"{said[-4000:]}\noperator: {log.read_text()[-3000:]}"
    failed = [name for name in wanted if f"{name}: {STATE}=upgrade-failed" in said]
    assert failed, said[-4000:]
    assert "driver pod nvidia-driver-daemonset-" in said and "CrashLoopBackOff" in said, said[-4000:]
    assert RESUME in said and "upgrade-required to retry" in said, said[-4000:]
    node = json.loads(api.kubectl("get", "node", failed[0], "-o", "json").stdout)
    assert node["metadata"]["labels"][STATE] == "upgrade-failed"
    assert node["spec"].get("unschedulable") is True, "the operator leaves the failed node cordoned"
    assert time.monotonic() - started < 240 * len(wanted), "the wait stopped at the failure, not at its timeout"
