"""The validation gate's judgement (playbooks/library/gpuboot_cluster_check.py) on API objects
shaped as the API server returns them: resources compared exactly, the reason a pod gives,
Calico's conditions, and the report's rows. The lab test runs it against a real cluster."""
from __future__ import annotations

from tests.support.modules import load_module

check = load_module("gpuboot_cluster_check")


def node(name: str, allocatable: dict[str, str]) -> dict:
    return {"metadata": {"name": name, "labels": {}},
            "status": {"allocatable": {"cpu": "8", **allocatable}, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_resources_must_equal_what_the_inventory_implies():
    nodes = {"gpu1": node("gpu1", {"nvidia.com/gpu": "8"}),
             "gpu2": node("gpu2", {"nvidia.com/mig-1g.10gb": "7"}),
             "gpu3": node("gpu3", {})}
    rows = check.check_resources(nodes, {
        "gpu1": {"resources": {"nvidia.com/gpu": 8}},
        "gpu2": {"resources": {"nvidia.com/mig-1g.10gb": 14}},
        "gpu3": {"resources": None},
        "gpu4": {"resources": {"nvidia.com/gpu": 1}}})
    by = {r["node"]: r for r in rows}
    assert by["gpu1"]["ok"] and by["gpu1"]["got"] == "nvidia.com/gpu=8"
    assert not by["gpu2"]["ok"] and by["gpu2"]["want"] == "nvidia.com/mig-1g.10gb=14"
    assert not by["gpu3"]["ok"] and "no GPU resource" in by["gpu3"]["reason"]
    assert not by["gpu4"]["ok"] and by["gpu4"]["got"] == "no such node"


def test_a_resource_kubelet_keeps_at_zero_is_not_advertised():
    # After the MIG manager cut the GPUs, kubelet keeps nvidia.com/gpu at 0 beside the MIG devices.
    nodes = {"h100": node("h100", {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "14"}),
             "gone": node("gone", {"nvidia.com/gpu": "0"})}
    rows = check.check_resources(nodes, {"h100": {"resources": {"nvidia.com/mig-1g.10gb": 14}},
                                         "gone": {"resources": {"nvidia.com/gpu": 8}}})
    by = {r["node"]: r for r in rows}
    assert by["h100"]["ok"] and by["h100"]["got"] == "nvidia.com/mig-1g.10gb=14"
    assert not by["gone"]["ok"] and by["gone"]["got"] == "none"


def test_an_undeclared_count_is_the_count_discovery_found_times_what_each_gpu_yields():
    nodes = {"l40s": node("l40s", {"nvidia.com/gpu": "8"}), "short": node("short", {"nvidia.com/gpu": "4"}),
             "mig": node("mig", {"nvidia.com/mig-1g.10gb": "7"})}
    rows = check.check_resources(nodes, {
        "l40s": {"resources": None, "per_gpu": {"nvidia.com/gpu": 4}, "found_gpus": 2},
        # One GPU fell off the bus after preflight counted 2, or time-slicing is not applied.
        "short": {"resources": None, "per_gpu": {"nvidia.com/gpu": 4}, "found_gpus": 2},
        # A MIG layout needs a declared count: only "some GPU resource" can be asked.
        "mig": {"resources": None, "per_gpu": None, "found_gpus": None}})
    by = {r["node"]: r for r in rows}
    assert by["l40s"]["ok"] and by["l40s"]["want"] == "nvidia.com/gpu=8 (2 GPU(s) found on the node)"
    assert not by["short"]["ok"] and by["short"]["got"] == "nvidia.com/gpu=4"
    assert "PCI bus" in by["short"]["reason"]
    assert by["mig"]["ok"] and by["mig"]["want"] == "nvidia.com/* > 0"


def test_a_pod_problem_is_said_in_its_containers_words_or_the_schedulers():
    crashing = {"status": {"phase": "Running", "containerStatuses": [{"ready": False, "state": {"waiting": {
        "reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}}]}}
    assert check.pod_problem(crashing).startswith("CrashLoopBackOff: back-off")
    pulling = {"status": {"phase": "Pending", "containerStatuses": [{"ready": False, "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "nvcr.io/nvidia/x:1"'}}}]}}
    assert "ImagePullBackOff" in check.pod_problem(pulling) and "nvcr.io/nvidia/x:1" in check.pod_problem(pulling)
    pending = {"status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                              "reason": "Unschedulable",
                                                              "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}}
    assert check.pod_problem(pending) == "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


FAILS = object()  # an answer kubectl could not give (the API unreachable, a timeout)


class FakeKube:
    """Answers `get` and `read` from a table, as the API server would (a unit-test stand-in
    for kubectl); an answer of FAILS is kubectl failing."""

    def __init__(self, answers: dict[tuple[str, ...], dict | None]) -> None:
        self.answers = answers

    def get(self, *args: str):
        answer = self.answers.get(args)
        return None if answer is FAILS else answer

    def read(self, *args: str):
        answer = self.answers.get(args)
        if answer is FAILS:
            raise check.KubeError(f"kubectl get {' '.join(args)} failed: Unable to connect to the server")
        return answer


def test_operator_rows_name_the_policy_state_and_each_unready_operand_per_node():
    pods = {"items": [
        {"metadata": {"name": "nvidia-device-plugin-daemonset-x1", "labels": {"app": "nvidia-device-plugin-daemonset"}},
         "spec": {"nodeName": "gpu2"},
         "status": {"phase": "Running", "containerStatuses": [{"ready": False, "state": {"terminated": {
             "reason": "Error", "message": "cannot open /dev/nvidia0"}}}]}},
        {"metadata": {"name": "gpu-feature-discovery-y", "labels": {"app": "gpu-feature-discovery"}},
         "spec": {"nodeName": "gpu1"}, "status": {"phase": "Running", "containerStatuses": [{"ready": True}]}}]}
    kube = FakeKube({("clusterpolicies.nvidia.com", "cluster-policy"): {"status": {"state": "notReady"}},
                     ("pods", "-n", "gpu-operator"): pods})
    rows = check.check_operator(kube, "gpu-operator", {"gpu1": {}, "gpu2": {}})
    assert [(r["node"], r["check"], r["ok"]) for r in rows] == [
        ("-", "ClusterPolicy", False), ("gpu2", "operand nvidia-device-plugin-daemonset", False)]
    assert rows[1]["reason"] == "nvidia-device-plugin-daemonset-x1: Error: cannot open /dev/nvidia0"


def ready_pod(name: str, app: str, node_name: str) -> dict:
    return {"metadata": {"name": name, "labels": {"app": app}}, "spec": {"nodeName": node_name},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"ready": True}]}}


def test_a_gpu_node_without_a_pod_of_an_expected_operand_fails():
    """Every pod that exists is Ready, yet gpu2 has no driver pod (its labels keep the
    DaemonSet away): the node is short, not fine."""
    pods = {"items": [
        ready_pod("nvidia-driver-daemonset-5.15-ubuntu22.04-a", "nvidia-driver-daemonset-5.15-ubuntu22.04", "gpu1"),
        ready_pod("nvidia-device-plugin-daemonset-a", "nvidia-device-plugin-daemonset", "gpu1"),
        ready_pod("nvidia-device-plugin-daemonset-b", "nvidia-device-plugin-daemonset", "gpu2")]}
    kube = FakeKube({("clusterpolicies.nvidia.com", "cluster-policy"): {"status": {"state": "ready"}},
                     ("pods", "-n", "gpu-operator"): pods})
    want = ["nvidia-driver-daemonset", "nvidia-device-plugin-daemonset"]
    rows = check.check_operator(kube, "gpu-operator", {"gpu1": {"operands": want}, "gpu2": {"operands": want},
                                                       "dgx1": {"operands": want[1:]}})
    short = [(r["node"], r["check"], r["got"]) for r in rows if not r["ok"]]
    assert short == [("dgx1", "operand nvidia-device-plugin-daemonset", "no pod"),
                     ("gpu2", "operand nvidia-driver-daemonset", "no pod")]
    assert "kubectl get node gpu2 --show-labels" in next(r for r in rows if r["node"] == "gpu2")["reason"]


def test_a_driver_pod_of_an_nvidia_driver_object_counts_as_the_nodes_driver():
    """With NVIDIADriver objects (mixed driver kinds) the operator names each driver DaemonSet
    nvidia-<driverType>-driver-<os>-<hash> (internal/state/driver.go, getDriverAppName) and
    labels its pods app.kubernetes.io/component=nvidia-driver: that is the node's driver."""
    made = ready_pod("nvidia-gpu-driver-ubuntu22.04-7c6d7bd86b-x", "nvidia-gpu-driver-ubuntu22.04-7c6d7bd86b", "gpu1")
    made["metadata"]["labels"]["app.kubernetes.io/component"] = "nvidia-driver"
    other = ready_pod("nvidia-vgpu-manager-daemonset-y", "nvidia-vgpu-manager-daemonset", "gpu2")
    kube = FakeKube({("clusterpolicies.nvidia.com", "cluster-policy"): {"status": {"state": "ready"}},
                     ("pods", "-n", "gpu-operator"): {"items": [made, other]}})
    want = {"operands": ["nvidia-driver-daemonset"]}
    rows = check.check_operator(kube, "gpu-operator", {"gpu1": want, "gpu2": want})
    assert [(r["node"], r["check"]) for r in rows if not r["ok"]] == [("gpu2", "operand nvidia-driver-daemonset")]


def test_the_expected_operands_follow_the_driver_kind_and_mig():
    from gpuboot.gpu_plan import NodeGpu
    whole = NodeGpu("g1", None, 8, "precompiled", None, None, (), None)
    assert whole.operand_apps()[0] == "nvidia-driver-daemonset" and "nvidia-mig-manager" not in whole.operand_apps()
    dgx = NodeGpu("g2", None, 8, "preinstalled", None, None, (), "all-1g.10gb")
    assert "nvidia-driver-daemonset" not in dgx.operand_apps() and "nvidia-mig-manager" in dgx.operand_apps()
    assert {"nvidia-container-toolkit-daemonset", "nvidia-device-plugin-daemonset", "gpu-feature-discovery",
            "nvidia-operator-validator"} <= set(dgx.operand_apps())


def test_a_kubectl_failure_is_a_failure_not_an_empty_answer():
    kube = FakeKube({("clusterpolicies.nvidia.com", "cluster-policy"): {"status": {"state": "ready"}},
                     ("pods", "-n", "gpu-operator"): FAILS})
    import pytest
    with pytest.raises(check.KubeError, match="Unable to connect"):
        check.check_operator(kube, "gpu-operator", {"gpu1": {"operands": ["nvidia-driver-daemonset"]}})
    with pytest.raises(check.KubeError):
        check.check_calico(FakeKube({("tigerastatuses.operator.tigera.io",): FAILS}))
    with pytest.raises(check.KubeError):
        check.check_fabric(FakeKube({("nicclusterpolicies.mellanox.com", "nic-cluster-policy"): FAILS}), {},
                           "nvidia-network-operator", False)
    with pytest.raises(check.KubeError):
        check.settled(FakeKube({("nodes",): FAILS}), [], 60)


def test_calico_rows_say_which_component_is_not_available_and_why():
    statuses = {"items": [
        {"metadata": {"name": "calico"}, "status": {"conditions": [
            {"type": "Available", "status": "False"},
            {"type": "Degraded", "status": "True", "reason": "ResourceNotReady",
             "message": "IP pool 10.250.0.0/16 is not within the cluster's pod CIDR"}]}},
        {"metadata": {"name": "apiserver"}, "status": {"conditions": [{"type": "Available", "status": "True"}]}}]}
    rows = check.check_calico(FakeKube({("tigerastatuses.operator.tigera.io",): statuses}))
    assert [(r["check"], r["ok"]) for r in rows] == [("Calico calico", False), ("Calico apiserver", True)]
    assert rows[0]["reason"].startswith("ResourceNotReady: IP pool")
    assert check.check_calico(FakeKube({}))[0]["reason"] == "the tigera-operator reports no component"


def test_fabric_rows_compare_rdma_and_vf_resources_and_name_the_vfs_not_made():
    nodes = {"hgx01": node("hgx01", {"nvidia.com/ib_vf": "32", "nvidia.com/gpu": "8"}),
             "hgx02": node("hgx02", {"nvidia.com/ib_vf": "28"}),
             "l40s01": node("l40s01", {"nvidia.com/roce_vf": "16", "nvidia.com/roce_shared": "0"})}
    states = {"items": [{"metadata": {"name": "hgx01"}, "status": {"syncStatus": "Succeeded"}},
                        {"metadata": {"name": "hgx02"}, "status": {"syncStatus": "Failed",
                                                                   "lastSyncError": "ibp209s0: sriov_totalvfs 0"}}]}
    kube = FakeKube({("nicclusterpolicies.mellanox.com", "nic-cluster-policy"): {"status": {"state": "ready"}},
                     ("sriovnetworknodestates.sriovnetwork.openshift.io", "-n", "nvidia-network-operator"): states})
    fabric = {"hgx01": {"nvidia.com/ib_vf": 32}, "hgx02": {"nvidia.com/ib_vf": 32},
              # by device id: the VF count is known only as more than 0; the shared pool is rdmaHcaMax.
              "l40s01": {"nvidia.com/roce_vf": None, "nvidia.com/roce_shared": 32}}
    rows = check.check_fabric_resources(nodes, fabric) + check.check_fabric(kube, fabric, "nvidia-network-operator", True)
    by = {(r["node"], r["check"]): r for r in rows}
    assert by[("-", "NicClusterPolicy")]["ok"]
    assert by[("hgx01", "fabric allocatable")]["ok"] and by[("hgx01", "VFs made")]["ok"]
    assert not by[("hgx02", "fabric allocatable")]["ok"] and by[("hgx02", "fabric allocatable")]["got"] == "nvidia.com/ib_vf=28"
    assert not by[("hgx02", "VFs made")]["ok"] and by[("hgx02", "VFs made")]["reason"] == "ibp209s0: sriov_totalvfs 0"
    shared = by[("l40s01", "fabric allocatable")]
    assert not shared["ok"] and shared["want"] == "nvidia.com/roce_shared=32, nvidia.com/roce_vf=>0"
    assert "matches no port advertises 0" in shared["reason"]
    assert by[("l40s01", "VFs made")]["got"] == "not reported"
    # GPU resources are compared on their own: a node's VF resource is not a GPU.
    assert check.check_resources(nodes, {"hgx01": {"resources": {"nvidia.com/gpu": 8}}})[0]["ok"]


def test_gfd_labels_must_name_the_declared_model_and_count():
    labelled = node("gpu1", {"nvidia.com/gpu": "8"})
    labelled["metadata"]["labels"] = {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "8",
                                      "nvidia.com/gpu.family": "ada-lovelace"}
    right = node("gpu2", {"nvidia.com/gpu": "1"})
    right["metadata"]["labels"] = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "1",
                                   "nvidia.com/gpu.family": "hopper"}
    unlabelled = node("gpu3", {"nvidia.com/gpu": "1"})
    want = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.family": "hopper"}
    rows = check.check_gfd_labels({"gpu1": labelled, "gpu2": right, "gpu3": unlabelled}, {
        "gpu1": {"resources": {"nvidia.com/gpu": 8}, "gfd_labels": want},
        "gpu2": {"resources": {"nvidia.com/gpu": 1}, "gfd_labels": {**want, "nvidia.com/gpu.count": "1"}},
        "gpu3": {"resources": {"nvidia.com/gpu": 1}, "gfd_labels": {"nvidia.com/gpu.family": "hopper"}},
        "gpu4": {"resources": None}})
    by = {(r["node"], r["check"]): r for r in rows}
    # An L40S node in an H200 group: its counts match, the gate still refuses it by name.
    assert not by[("gpu1", "label gpu.product")]["ok"] and by[("gpu1", "label gpu.product")]["got"] == "NVIDIA-L40S"
    assert "nvidia-smi -L" in by[("gpu1", "label gpu.product")]["reason"]
    assert by[("gpu1", "label gpu.count")]["ok"] and not by[("gpu1", "label gpu.family")]["ok"]
    assert all(by[("gpu2", c)]["ok"] for c in ("label gpu.product", "label gpu.count", "label gpu.family"))
    assert not by[("gpu3", "label gpu.family")]["ok"] and "has not labelled" in by[("gpu3", "label gpu.family")]["reason"]
    assert not any(node_name == "gpu4" for node_name, _ in by)


class Clock:
    """time.monotonic and time.sleep for `settled`: sleeping moves the clock on."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class NodeReads(FakeKube):
    """The nodes as the kubelet publishes them: each read returns the next answer, the last one
    from then on."""

    def __init__(self, *answers: dict) -> None:
        super().__init__({})
        self.reads = list(answers)
        self.count = 0

    def read(self, *args: str):
        assert args == ("nodes",)
        self.count += 1
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]


def test_node_checks_read_again_until_the_kubelet_publishes_what_a_plugin_registered():
    before = {"items": [node("hgx01", {"nvidia.com/ib_shared": "0"})]}
    after = {"items": [node("hgx01", {"nvidia.com/ib_shared": "63"})]}
    checks = [lambda nodes: check.check_fabric_resources(nodes, {"hgx01": {"nvidia.com/ib_shared": 63}})]
    clock = Clock()
    kube = NodeReads(before, before, after)
    nodes, rows = check.settled(kube, checks, 60, clock, clock.sleep)
    assert [r["ok"] for r in rows] == [True] and kube.count == 3 and clock.now == 10
    assert nodes["hgx01"]["status"]["allocatable"]["nvidia.com/ib_shared"] == "63"


def test_a_shortfall_that_lasts_the_settle_time_is_reported_with_what_was_read_last():
    short = {"items": [node("gpu1", {"nvidia.com/gpu": "4"})]}
    checks = [lambda nodes: check.check_resources(nodes, {"gpu1": {"resources": {"nvidia.com/gpu": 8}}})]
    clock = Clock()
    kube = NodeReads(short)
    _, rows = check.settled(kube, checks, 60, clock, clock.sleep)
    assert [(r["got"], r["ok"]) for r in rows] == [("nvidia.com/gpu=4", False)]
    assert clock.now == 60 and kube.count == 13
    # With nothing to wait for, the nodes are read once.
    kube = NodeReads(short)
    assert check.settled(kube, [], 60, clock, clock.sleep)[1] == [] and kube.count == 1
