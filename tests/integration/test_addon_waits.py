"""The add-on waits against a real API server: the calico role's ready.yml and the
gpu_operator role's ready.yml, run by the real ansible-playbook (local connection) with the
real kubectl, and the network_operator role's. The operators do not run here (the real ones do in
test_real_gpu_operator_pods.py and test_real_network_operator_pods.py), so the test writes the
status they would write, under NVIDIA's real CRDs at the tags the lab's release pins (read from
the upstream source trees; skipped, naming the tree, where absent), and Calico's double (TigeraStatus conditions, the ClusterPolicy's and the
NicClusterPolicy's state, each SR-IOV node state's sync status, the fabric nodes' allocatable).
Shown: a wait passes when every component is Available (the policy ready), and otherwise stops
naming each component with the reason and message of its Degraded condition (the policy's
state). Operand pods named
with their node and reason are shown in the lab (test_lab_gpu_stack.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuboot_lab import LAB_RELEASE
from tests.integration.test_double_schemas_vs_real_charts import UPSTREAMS, lab_chart_version, real_crd, source_tree

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "tests" / "doubles" / "charts"
CLUSTER_POLICY_REQUIRED = ("daemonsets", "dcgm", "dcgmExporter", "devicePlugin", "driver", "gfd",
                           "nodeStatusExporter", "operator", "toolkit")


def apply_real_crds(api, chart: str, *names: str) -> None:
    """NVIDIA's CRDs `names` as the chart (or the operator's manifests) at the lab release's tag
    carry them, applied and established."""
    upstream = UPSTREAMS[chart]
    _, git_dir, tag = source_tree(chart, lab_chart_version(chart), LAB_RELEASE)
    for name in names:
        found = real_crd(git_dir, tag, name, upstream.chart_dir)
        assert found, f"{chart} {tag}: no CRD {name}"
        api.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(found[1]))
    api.established(*names)


def wait(api, tmp_path, role: str, variables: dict) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / f"{role}-wait.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "wait", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "wait", "ansible.builtin.include_role": {"name": role, "tasks_from": "ready.yml"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               PATH=f"{api.bin_dir}:{os.environ['PATH']}", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN="memory")
    extra = json.dumps({"ansible_python_interpreter": sys.executable, **variables})
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", extra, str(playbook)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def status(api, kind: str, name: str, body: dict) -> None:
    api.kubectl("patch", kind, name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": body}))


def test_calico_wait_passes_when_available_and_names_the_degraded_component(api, tmp_path):
    api.kubectl("apply", "--server-side", "-f", str(CRDS / "crd.projectcalico.org.v1" / "templates" /
                                                    "operator.tigera.io_tigerastatuses.yaml"))
    api.established("tigerastatuses.operator.tigera.io")
    for name in ("calico", "apiserver"):
        api.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "operator.tigera.io/v1", "kind": "TigeraStatus",
                                                           "metadata": {"name": name}}))
        status(api, "tigerastatuses.operator.tigera.io", name, {"conditions": [
            {"type": "Available", "status": "True", "reason": "AllObjectsAvailable", "message": ""}]})
    variables = {"calico_kubeconfig": str(api.kubeconfig), "calico_ready_timeout": 5}
    ok = wait(api, tmp_path, "calico", variables)
    assert ok.returncode == 0, ok.stdout[-3000:]

    status(api, "tigerastatuses.operator.tigera.io", "calico", {"conditions": [
        {"type": "Available", "status": "False", "reason": "ResourceNotReady", "message": ""},
        {"type": "Degraded", "status": "True", "reason": "ResourceNotReady",
         "message": "IPPool 10.250.0.0/16 is not within the platform's configured pod network CIDR(s)"}]})
    short = wait(api, tmp_path, "calico", variables)
    assert short.returncode != 0
    assert "- calico: Degraded ResourceNotReady: IPPool 10.250.0.0/16 is not within" in short.stdout, short.stdout[-3000:]
    assert "- apiserver" not in short.stdout


def test_gpu_operator_wait_passes_when_ready_and_names_the_state_otherwise(api, tmp_path):
    apply_real_crds(api, "gpu-operator", "clusterpolicies.nvidia.com")
    api.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": "gpu-operator"}}))
    api.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                                                       "metadata": {"name": "cluster-policy"},
                                                       # the sections NVIDIA's CRD requires
                                                       "spec": dict.fromkeys(CLUSTER_POLICY_REQUIRED, {})}))
    variables = {"gpu_operator_kubeconfig": str(api.kubeconfig), "gpu_operator_ready_timeout": 5,
                 # gpuboot_gpu's shape: every node carries its labels (none asks for a MIG layout here)
                 "gpu_operator_plan": {"nodes": {"gpu01": {"labels": {}}, "gpu02": {"labels": {}}}}}

    def ready(reason: str) -> dict:
        return {"state": "ready", "conditions": [{"type": "Ready", "status": "True", "reason": reason, "message": "",
                                                  "lastTransitionTime": "2026-11-28T20:39:05Z"}]}

    status(api, "clusterpolicies.nvidia.com", "cluster-policy", {"state": "notReady"})
    # Two operand pods as the kubelet reports them: one stuck in its init container (seen in the
    # lab with NVIDIA's real operands on a node whose / is not a shared mount), one running.
    stuck = "failed to generate spec: path \"/run/nvidia\" is mounted on \"/run\" but it is not a shared or slave mount"
    for name, ready_, init, main in (
            ("nvidia-device-plugin-daemonset-x", "False",
             {"waiting": {"reason": "CreateContainerError", "message": stuck}}, {"waiting": {"reason": "PodInitializing"}}),
            ("nvidia-dcgm-exporter-z", "False", {"running": {"startedAt": "2026-11-28T21:05:00Z"}},
             {"waiting": {"reason": "PodInitializing"}}),
            ("gpu-feature-discovery-y", "True", {"terminated": {"exitCode": 0, "reason": "Completed"}}, {"running": {}})):
        api.kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "gpu-operator"},
            "spec": {"nodeName": "gpu01", "initContainers": [{"name": "wait", "image": "i"}],
                     "containers": [{"name": "main", "image": "i"}]}}))
        api.kubectl("patch", "pod", name, "-n", "gpu-operator", "--subresource=status", "--type=merge", "-p", json.dumps(
            {"status": {"phase": "Running" if ready_ == "True" else "Pending",
                        "conditions": [{"type": "Ready", "status": ready_}],
                        "initContainerStatuses": [{"name": "wait", "image": "i", "imageID": "", "ready": ready_ == "True",
                                                   "restartCount": 0, "state": init}],
                        "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": ready_ == "True",
                                               "restartCount": 0, "state": main}]}}))
    short = wait(api, tmp_path, "gpu_operator", variables)
    assert short.returncode != 0 and "ClusterPolicy is notReady after 5 s" in short.stdout, short.stdout[-3000:]
    said = " ".join(short.stdout.split())
    assert f"- gpu01: nvidia-device-plugin-daemonset-x CreateContainerError {' '.join(stuck.split())}" in \
        said.replace('\\"', '"'), short.stdout[-3000:]
    # An init container still running (NVIDIA's wait for the toolkit's and driver's validations).
    assert "- gpu01: nvidia-dcgm-exporter-z Init still in init container wait" in said, short.stdout[-3000:]
    assert "gpu-feature-discovery-y" not in short.stdout
    # NVIDIA's operator says `ready` when NFD labelled no node (seen with the real v26.7.0 in the
    # lab, its NFD pods failing): it deployed nothing, so a cluster with GPU nodes is not done.
    status(api, "clusterpolicies.nvidia.com", "cluster-policy", ready("NFDLabelsMissing"))
    no_nfd = wait(api, tmp_path, "gpu_operator", variables)
    assert no_nfd.returncode != 0 and "found no node labelled by Node Feature Discovery" in no_nfd.stdout, \
        no_nfd.stdout[-3000:]
    status(api, "clusterpolicies.nvidia.com", "cluster-policy", ready("NoGPUNodes"))
    no_gpu = wait(api, tmp_path, "gpu_operator", variables)
    assert no_gpu.returncode != 0 and "although the\ninventory has 2" in no_gpu.stdout.replace("  ", ""), \
        no_gpu.stdout[-3000:]
    # Without GPU nodes in the inventory, that is what done looks like.
    assert wait(api, tmp_path, "gpu_operator", variables | {"gpu_operator_plan": {"nodes": {}}}).returncode == 0
    status(api, "clusterpolicies.nvidia.com", "cluster-policy", ready("Reconciled"))
    ok = wait(api, tmp_path, "gpu_operator", variables)
    assert ok.returncode == 0, ok.stdout[-3000:]

    # The operator says ready Reconciled on its first pass, over DaemonSets it has just created
    # and whose status the DaemonSet controller has not yet written (seen with v26.7.0 in the lab
    # under load): a DaemonSet not yet counted wants 0 pods, which the operator takes as ready. gpuboot waits
    # for the controller's status of each one the ClusterPolicy owns, with every pod ready.
    policy = api.kubectl("get", "clusterpolicies.nvidia.com", "cluster-policy", "-o", "json").stdout
    policy_uid = json.loads(policy)["metadata"]["uid"]
    owner = [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy", "uid": policy_uid}]

    def daemonset(name: str, owners: list) -> None:
        api.kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": "gpu-operator", "ownerReferences": owners},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}))

    daemonset("nvidia-device-plugin-daemonset", owner)
    # A DaemonSet the chart made (NFD's worker), not the ClusterPolicy: not an operand of this wait.
    daemonset("gpu-operator-node-feature-discovery-worker", [])
    fresh = wait(api, tmp_path, "gpu_operator", variables)
    said = " ".join(fresh.stdout.split())
    assert fresh.returncode != 0 and "ClusterPolicy is ready Reconciled after 5 s" in said, fresh.stdout[-3000:]
    assert "- nvidia-device-plugin-daemonset: 0 wanted, ? updated, 0 ready; generation none/1" in said, \
        fresh.stdout[-3000:]
    assert "node-feature-discovery-worker" not in said.split("Operand DaemonSets not settled")[1]

    def ds_status(observed: int, wanted: int, updated: int, ready_: int) -> None:
        api.kubectl("patch", "daemonset", "nvidia-device-plugin-daemonset", "-n", "gpu-operator", "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {
                        "observedGeneration": observed, "desiredNumberScheduled": wanted, "currentNumberScheduled": wanted,
                        "numberMisscheduled": 0, "updatedNumberScheduled": updated, "numberReady": ready_}}))

    ds_status(1, 2, 2, 1)
    one_short = wait(api, tmp_path, "gpu_operator", variables)
    said = " ".join(one_short.stdout.split())
    assert one_short.returncode != 0 and "- nvidia-device-plugin-daemonset: 2 wanted, 2 updated, 1 ready; generation 1/1" \
        in said, one_short.stdout[-3000:]
    ds_status(1, 2, 2, 2)
    settled = wait(api, tmp_path, "gpu_operator", variables)
    assert settled.returncode == 0, settled.stdout[-3000:]
    # A DaemonSet whose only node is not a GPU node (the MPS daemon's selector) wants no pods: settled.
    ds_status(1, 0, 0, 0)
    assert wait(api, tmp_path, "gpu_operator", variables).returncode == 0


def test_network_operator_wait_needs_the_policy_ready_and_every_fabric_node_s_vfs(api, tmp_path):
    apply_real_crds(api, "network-operator", "nicclusterpolicies.mellanox.com",
                    "sriovnetworknodestates.sriovnetwork.openshift.io")
    api.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": "nvidia-network-operator"}}))
    # Cluster-scoped in a shared API server: applied as gpuboot applies it, deleted at the end.
    api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=json.dumps({
        "apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy", "metadata": {"name": "nic-cluster-policy"},
        "spec": {"ofedDriver": {"image": "doca-driver", "repository": "r", "version": "1"}}}))
    try:
        _network_operator_wait(api, tmp_path)
    finally:
        api.kubectl("delete", "nicclusterpolicies.mellanox.com", "nic-cluster-policy", "--ignore-not-found")
        api.kubectl("delete", "nodes", "hgx01", "hgx02", "--ignore-not-found")


def allocatable(api, node: str, resources: dict[str, str]) -> None:
    """What the kubelet would publish once a device plugin registered its devices."""
    body = {"cpu": "2", "memory": "8Gi", "pods": "110", **resources}
    # Replaced whole: a merge would keep a resource the kubelet no longer lists.
    api.kubectl("patch", "nodes", node, "--subresource=status", "--type=json", "-p", json.dumps(
        [{"op": "add", "path": "/status", "value": {"capacity": body, "allocatable": body}}]))


def _network_operator_wait(api, tmp_path):
    for node in ("hgx01", "hgx02"):
        api.kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "sriovnetwork.openshift.io/v1", "kind": "SriovNetworkNodeState",
            "metadata": {"name": node, "namespace": "nvidia-network-operator"}, "spec": {}}))
    for node in ("hgx01", "hgx02"):
        api.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
        allocatable(api, node, {"nvidia.com/ib_vf": "8", "nvidia.com/ib_shared": "63"})
    plan = {"sriov": True, "nfd": True, "node_labels": {"hgx01": {}, "hgx02": {}},
            "nodes": {node: {"resources": {"nvidia.com/ib_vf": 8, "nvidia.com/ib_shared": 63}} for node in ("hgx01", "hgx02")}}
    variables = {"network_operator_kubeconfig": str(api.kubeconfig), "network_operator_ready_timeout": 5,
                 "network_operator_plan": plan, "network_operator_release": {}, "network_operator_images": {}}
    missing = "ForcePrecompiled is enabled and precompiled tag was not found: 1-6.8.0-51-generic-ubuntu24.04-amd64"
    status(api, "nicclusterpolicies.mellanox.com", "nic-cluster-policy", {"state": "notReady", "appliedStates": [
        {"name": "state-OFED", "state": "error", "message": missing},
        {"name": "state-RDMA-device-plugin", "state": "ready"}]})
    short = wait(api, tmp_path, "network_operator", variables)
    assert short.returncode != 0 and "NicClusterPolicy notReady" in short.stdout, short.stdout[-3000:]
    # The operator's own reason per component; a ready component is not named.
    assert f"- state-OFED: error {missing}" in short.stdout, short.stdout[-3000:]
    assert "state-RDMA-device-plugin" not in short.stdout
    # No NFD here: each fabric node is named with the labels the operator places its operands by.
    assert "- hgx01: no feature.node.kubernetes.io/pci-15b3.present" in short.stdout, short.stdout[-3000:]
    for node in ("hgx01", "hgx02"):
        api.kubectl("label", "node", node, "feature.node.kubernetes.io/pci-15b3.present=true",
                    "feature.node.kubernetes.io/system-os_release.ID=ubuntu",
                    "feature.node.kubernetes.io/system-os_release.VERSION_ID=24.04",
                    "feature.node.kubernetes.io/kernel-version.full=6.8.0-51-generic")
    status(api, "nicclusterpolicies.mellanox.com", "nic-cluster-policy", {"state": "ready"})
    api.kubectl("patch", "sriovnetworknodestates.sriovnetwork.openshift.io", "hgx01", "-n", "nvidia-network-operator",
                "--subresource=status", "--type=merge", "-p", json.dumps({"status": {"syncStatus": "Succeeded"}}))
    api.kubectl("patch", "sriovnetworknodestates.sriovnetwork.openshift.io", "hgx02", "-n", "nvidia-network-operator",
                "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
                    "syncStatus": "Failed", "lastSyncError": "double: ibp24s0 sriov_totalvfs is 0"}}))
    short = wait(api, tmp_path, "network_operator", variables)
    assert short.returncode != 0 and "- hgx02: VFs Failed double: ibp24s0 sriov_totalvfs is 0" in short.stdout, \
        short.stdout[-3000:]
    assert "- hgx01:" not in short.stdout
    api.kubectl("patch", "sriovnetworknodestates.sriovnetwork.openshift.io", "hgx02", "-n", "nvidia-network-operator",
                "--subresource=status", "--type=merge", "-p", json.dumps({"status": {"syncStatus": "Succeeded"}}))
    # The policy is ready and the VFs made, but hgx02's kubelet has not yet published what its
    # device plugins registered (its next node status): the phase is not done.
    allocatable(api, "hgx02", {"nvidia.com/ib_shared": "63"})
    short = wait(api, tmp_path, "network_operator", variables)
    assert short.returncode != 0 and "- hgx02: nvidia.com/ib_vf=0 (want 8): the device plugin has not registered" \
        in short.stdout, short.stdout[-3000:]
    assert "- hgx01:" not in short.stdout and "hgx02: nvidia.com/ib_shared" not in short.stdout
    allocatable(api, "hgx02", {"nvidia.com/ib_vf": "8", "nvidia.com/ib_shared": "63"})
    ok = wait(api, tmp_path, "network_operator", variables)
    assert ok.returncode == 0, ok.stdout[-3000:]
