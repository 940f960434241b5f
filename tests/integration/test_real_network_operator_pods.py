"""NVIDIA's real Network Operator with its operands' pods (issue 29, points 3 and 4): the
controller built from Mellanox/network-operator's tree at the pinned tag (as
test_real_network_operator.py runs it, with the same loopback registry standing for the mirror
and holding the DOCA tags the plan lists) on a real API server whose DaemonSet, Deployment and
ReplicaSet controllers and scheduler make and bind the pods of what it deploys, and a TEST
DOUBLE of the nodes' kubelets (`tests/doubles/kubelet_double.py`) reporting them running, or one crashing.

The case: RDMA shared ports only, no VFs (tests/cli/test_network_renders.py's shared-networks:
INI with host ranges, group_vars/ and host_vars/), so that no SR-IOV config daemon is needed.
Held against gpuboot:
- the operator walks its states to a ready NicClusterPolicy: the DOCA driver's pod ready on a
  fabric node lifts the operator's own wait label there (network.nvidia.com/operator.mofed.wait),
  and only then do the components held behind it run there;
- the phase's wait (roles/network_operator/tasks/ready.yml) passes on that policy once each
  fabric node advertises its plugins' resources (published here as its kubelet would), and
  names the nodes that do not before;
- an RDMA shared device plugin that cannot start on one node makes the operator say notReady,
  and the wait names the operator's failing state, the node, the pod and its reason.
Skipped, naming what to bring, without the source tree."""
from __future__ import annotations

import json

import pytest

from tests.cli.test_network_renders import nic_only, shared_networks
from tests.doubles import kubelet_double as lab
from tests.integration import test_real_network_operator as real_network
from tests.integration.test_addon_waits import wait as addon_wait
from tests.integration.test_real_network_operator import MOFED_WAIT, apply_as_the_phase, controller, operator_env
from tests.support.apiserver import ApiServer
from tests.support.modules import load_module

pytestmark = [pytest.mark.lab, pytest.mark.slow]

READY_S = 300
NIC_POLICY = "nicclusterpolicies.mellanox.com"
# validate's judgement of a ready pod (every container ready), from the product.
pod_ready = load_module("gpuboot_cluster_check").pod_ready
# The operator's image and the loopback registry standing for the mirror, as the module without pods has them.
operator_image = real_network.operator_image
registry = real_network.registry


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with lab.api_with_pod_controllers(tmp_path_factory.mktemp("network-pods-api")) as server:
        yield server


def policy(api: ApiServer) -> dict:
    return json.loads(api.kubectl("get", NIC_POLICY, "nic-cluster-policy", "-o", "json").stdout)


def wait_inputs(api: ApiServer, namespace: str, plan: dict, timeout: int) -> dict:
    """The role inputs the phase's wait (roles/network_operator/tasks/ready.yml) reads."""
    return {"network_operator_kubeconfig": str(api.kubeconfig), "network_operator_namespace": namespace,
            "network_operator_ready_timeout": timeout, "network_operator_plan": plan,
            "network_operator_release": {}, "network_operator_images": {}}


def state(api: ApiServer) -> str:
    return lab.policy_state(api, NIC_POLICY, "nic-cluster-policy")


def publish_devices(api: ApiServer, plan: dict, node: str) -> None:
    """What the node's kubelet publishes in its next status once the device plugins on it
    registered their resources (the kubelet double runs no plugin): the counts the node's NICs
    plan, as the real plugins would list them."""
    counts = {name: str(count or 1) for name, count in plan["nodes"][node]["resources"].items()}
    api.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p",
                json.dumps({"status": {"capacity": counts, "allocatable": counts}}))


def test_the_real_network_operator_gets_ready_as_the_phase_waits_and_a_broken_plugin_is_named(
        operator_image, registry, api, helm, tmp_path):
    binary, image_root = operator_image
    applied = apply_as_the_phase(shared_networks(tmp_path / "inventory"), api, helm, tmp_path, registry, lab.ready_node)
    cluster, namespace = applied.rendered.cluster, applied.rendered.namespace
    plan = cluster.nic_plan.as_data()
    assert not plan["sriov"] and sorted(applied.fabric) == ["ib1", "ib2", "roce1"], plan
    variables = wait_inputs(api, namespace, plan, 60)
    log = tmp_path / "operator.log"
    with lab.KubeletDouble(api, namespace) as kubelets:
        with controller(binary, operator_env(applied, image_root, api), image_root, log):
            lab.wait_until("a ready NicClusterPolicy", lambda: state(api) == "ready", READY_S, log,
                           found=lambda: {s["name"]: s["state"] for s in
                                          policy(api).get("status", {}).get("appliedStates", [])})
            nodes = {n["metadata"]["name"]: n["metadata"].get("labels") or {}
                     for n in json.loads(api.kubectl("get", "nodes", "-o", "json").stdout)["items"]}
            # The operator lifted its own wait label where the DOCA driver came up, and on no
            # node outside the fabric did anything of it run.
            assert all(nodes[name].get(MOFED_WAIT) == "false" for name in applied.fabric), nodes
            pods = lab.pods_in(api, namespace)
            assert pods and all(pod_ready(p) for p in pods), [p["metadata"]["name"] for p in pods if not pod_ready(p)]
            strays = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName") in applied.others]
            assert not strays, f"operands outside the fabric: {strays}"
            plugin = [p for p in pods if p["metadata"]["name"].startswith("rdma-shared-dp-ds")]
            assert sorted(p["spec"]["nodeName"] for p in plugin) == sorted(applied.fabric), \
                [p["metadata"]["name"] for p in pods]

            # The policy is ready, but no kubelet has published the plugins' devices yet: the
            # phase waits for them, and names each node that does not advertise them.
            short = addon_wait(api, tmp_path, "network_operator", variables | {"network_operator_ready_timeout": 5})
            said = " ".join(short.stdout.split())
            first = sorted(applied.fabric)[0]
            assert short.returncode != 0 and f"- {first}: " in said and "the device plugin has not registered it" \
                in said, short.stdout[-3000:]
            for node in applied.fabric:
                publish_devices(api, plan, node)
            ok = addon_wait(api, tmp_path, "network_operator", variables)
            assert ok.returncode == 0, ok.stdout[-3000:]

            victim = sorted(applied.fabric)[0]
            lab.operator_says_not_ready(kubelets, lambda pod, c: pod["spec"]["nodeName"] == victim
                                    and pod["metadata"]["name"].startswith("rdma-shared-dp-ds"),
                                    lambda: state(api), log)
            short = addon_wait(api, tmp_path, "network_operator", variables | {"network_operator_ready_timeout": 10})
            said = " ".join(short.stdout.split())
            assert short.returncode != 0 and "NicClusterPolicy notReady" in said, short.stdout[-3000:]
            assert f"- {victim}: rdma-shared-dp-ds-" in said and "CrashLoopBackOff" in said, short.stdout[-3000:]
            failing = sorted(name for name, state in ((s["name"], s["state"]) for s in
                                                      policy(api)["status"]["appliedStates"]) if state != "ready")
            assert failing and all(f"- {name}: " in said for name in failing), (failing, short.stdout[-3000:])
        lab.remove_workloads(api, namespace, log)
    assert not kubelets.errors, kubelets.errors


def test_without_node_feature_discovery_s_labels_the_operator_places_nothing_and_the_wait_says_why(
        operator_image, registry, api, helm, tmp_path, monkeypatch):
    """The real operator places the DOCA driver and the RDMA shared device plugin by NFD's labels
    (a Mellanox NIC, the OS, the kernel). Fabric nodes that NFD has not labelled yet (a cluster
    whose NFD comes later, or never) get neither, the policy stays notReady with no pod to blame,
    and the phase's wait names each node's missing labels and whose NFD should give them. Found
    with this operator: the network phase ran before the GPU Operator's, whose NFD is the
    cluster's, so every first `up` of a cluster with NICs waited here for labels in vain."""
    binary, image_root = operator_image
    monkeypatch.setattr(real_network, "nfd_labels", lambda *args, **kwargs: {})
    applied = apply_as_the_phase(nic_only(tmp_path / "inventory"), api, helm, tmp_path, registry, lab.ready_node)
    cluster, namespace = applied.rendered.cluster, applied.rendered.namespace
    plan = cluster.nic_plan.as_data()
    assert plan["nfd"] and sorted(applied.fabric) == ["ib1", "ib2", "roce1"], plan
    variables = wait_inputs(api, namespace, plan, 45)
    log = tmp_path / "operator.log"
    with lab.KubeletDouble(api, namespace) as kubelets:
        with controller(binary, operator_env(applied, image_root, api), image_root, log):
            short = addon_wait(api, tmp_path, "network_operator", variables)
            said = " ".join(short.stdout.split())
            assert short.returncode != 0 and "NicClusterPolicy notReady" in said, short.stdout[-3000:]
            assert "state-OFED: notReady" in said and "state-RDMA-device-plugin: notReady" in said, said[-3000:]
            for node in applied.fabric:
                assert (f"- {node}: no feature.node.kubernetes.io/pci-15b3.present, "
                        "feature.node.kubernetes.io/system-os_release.ID") in said, said[-3000:]
            assert "NFD is this chart's" in said, said[-3000:]
            pods = lab.pods_in(api, namespace)
            placed = sorted(p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith(
                ("mofed-", "rdma-shared-dp-ds")))
            assert not placed, placed
        lab.remove_workloads(api, namespace, log)
    assert not kubelets.errors, kubelets.errors
