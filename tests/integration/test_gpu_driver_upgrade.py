"""`gpuboot upgrade`'s GPU driver phase follows the GPU Operator's upgrade controller (issue 16,
point 3), against a real API server: the wait the phase runs (playbooks/upgrade_gpu_driver.yml's
gpuboot_driver_upgrade) in the real ansible-playbook with the real kubectl.

The operator's upgrade controller, its driver DaemonSet and the nodes' kubelets cannot run
here: tests/doubles/gpu_operator/upgrade.py is their TEST DOUBLE, walking each node's
nvidia.com/gpu-driver-upgrade-state through the documented states after the ClusterPolicy's
driver version moves (what the phase's apply does; that apply is up's, tested in the GPU lab).
Shown: the wait passes only when every operator-managed node runs the new driver, ready and
upgrade-done; it never cordons or drains a node itself; a node labelled to skip is reported and
not waited for; a node whose new driver fails stops the run at once, naming the node, its pod's
reason and the command that continues."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import yaml

from tests.doubles.gpu_operator.upgrade import DoubleDriverUpgrade

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "tests" / "doubles" / "charts" / "gpu-operator" / "crds" / "nvidia.com_clusterpolicies.yaml"
OS_TAGS = {"g1": "ubuntu22.04", "g2": "ubuntu22.04", "g3": "ubuntu24.04", "g4": "ubuntu22.04"}
RESUME = "gpuboot upgrade inventory.yml --to k8s-1.37 --resume"


def follow(api, tmp_path, namespace: str, nodes: dict[str, str], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """The phase's wait, as upgrade_gpu_driver.yml runs it."""
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


def policy(api, version: str) -> None:
    api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=json.dumps({
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
        "spec": {"driver": {"enabled": True, "repository": "nvcr.io/nvidia", "image": "driver", "version": version,
                            "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 1,
                                              "maxUnavailable": "25%"}}}}))


def nodes_json(api) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in json.loads(api.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            if n["metadata"]["name"] in OS_TAGS}


def driver_images(api, namespace: str) -> dict[str, str]:
    pods = json.loads(api.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    return {p["spec"]["nodeName"]: p["spec"]["containers"][0]["image"] for p in pods}


@pytest.fixture
def gpu_nodes(api, request):
    """The operator's namespace (one per test: without kubelets a namespace with pods never
    finishes terminating) and four GPU nodes, one with the host's own driver."""
    namespace = f"gpu-driver-upgrade-{zlib.crc32(request.node.name.encode()):08x}"
    api.kubectl("apply", "--server-side", "-f", str(CRD))
    api.established("clusterpolicies.nvidia.com")
    api.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": namespace}}))
    for name in OS_TAGS:
        labels = {"nvidia.com/gpu.present": "true"}
        if name == "g3":  # the host's own driver (gpu.driver: preinstalled)
            labels["nvidia.com/gpu.deploy.driver"] = "false"
        api.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                           "metadata": {"name": name, "labels": labels}}))
    yield namespace
    api.kubectl("delete", "clusterpolicies.nvidia.com", "cluster-policy", "--ignore-not-found")
    api.kubectl("delete", "pods", "-n", namespace, "--all", "--grace-period=0", "--force")
    api.kubectl("delete", "namespace", namespace, "--wait=false")
    api.kubectl("delete", "nodes", *OS_TAGS, "--ignore-not-found")


def test_the_driver_phase_follows_the_operators_upgrade_controller_to_the_end(api, gpu_nodes, tmp_path):
    namespace = gpu_nodes
    policy(api, "570.158.01")
    with DoubleDriverUpgrade(api.bin_dir / "kubectl", api.kubeconfig, OS_TAGS, namespace) as operator:
        api.wait_for("pods", "-n", namespace, "nvidia-driver-daemonset-g4", jsonpath="{.metadata.name}")
        # What the phase's apply does: the ClusterPolicy names the target release's driver.
        api.kubectl("label", "node", "g4", "nvidia.com/gpu-driver-upgrade.skip=true")
        policy(api, "570.172.08")
        followed = follow(api, tmp_path, namespace, {"g1": "570.172.08", "g2": "570.172.08", "g4": "570.172.08"})
    assert followed.returncode == 0, followed.stdout[-4000:]
    assert not operator.errors, operator.errors
    images = driver_images(api, namespace)
    assert images["g1"] == images["g2"] == "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04"
    assert images["g4"] == "nvcr.io/nvidia/driver:570.158.01-ubuntu22.04"  # skipped, as labelled
    assert "g3" not in images  # the host's driver: the operator deploys none, gpuboot waits for none
    nodes = nodes_json(api)
    for name in ("g1", "g2"):
        assert nodes[name]["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-state"] == "upgrade-done"
        assert not nodes[name]["spec"].get("unschedulable")
        # The controller walked the documented states; nobody but it cordoned the node.
        assert operator.history[name][-8:] == ["upgrade-required", "cordon-required", "wait-for-jobs-required",
                                               "pod-deletion-required", "pod-restart-required", "validation-required",
                                               "uncordon-required", "upgrade-done"], operator.history[name]
    assert operator.most_in_flight == 1  # maxParallelUpgrades, as gpuboot's values set it
    shown = json.loads(api.kubectl("get", "node", "g1", "-o", "json", "--show-managed-fields").stdout)
    assert "gpuboot" not in {m["manager"] for m in shown["metadata"]["managedFields"]}
    # What the phase reports: each node's verdict and the states it was seen in.
    report = json.loads((tmp_path / "followed.json").read_text())
    assert report["left_alone"] == ["g4"]
    assert report["nodes"]["g4"]["said"] == "skipped (nvidia.com/gpu-driver-upgrade.skip=true): keeps driver " \
                                            "570.158.01-ubuntu22.04"
    assert report["nodes"]["g1"]["verdict"] == report["nodes"]["g2"]["verdict"] == "done"
    assert report["nodes"]["g2"]["states"][-1] == "upgrade-done" and len(report["nodes"]["g2"]["states"]) >= 3


def test_a_node_whose_new_driver_fails_stops_the_run_naming_it(api, gpu_nodes, tmp_path):
    namespace = gpu_nodes
    policy(api, "570.158.01")
    with DoubleDriverUpgrade(api.bin_dir / "kubectl", api.kubeconfig, OS_TAGS, namespace, broken={"g2"}) as operator:
        api.wait_for("pods", "-n", namespace, "nvidia-driver-daemonset-g4", jsonpath="{.metadata.name}")
        policy(api, "570.172.08")
        followed = follow(api, tmp_path, namespace, {n: "570.172.08" for n in ("g1", "g2", "g4")})
    assert followed.returncode != 0
    assert not operator.errors, operator.errors
    said = followed.stdout
    assert "the GPU Operator's driver upgrade failed on g2:" in said, said[-4000:]
    assert "g2: nvidia.com/gpu-driver-upgrade-state=upgrade-failed; driver pod nvidia-driver-daemonset-g2: " \
           "CrashLoopBackOff: double: nvidia.ko failed to load" in said
    assert RESUME in said and "upgrade-required to retry" in said
    # The operator leaves the failed node cordoned; the wait stopped without waiting out its timeout.
    assert nodes_json(api)["g2"]["spec"].get("unschedulable") is True
    assert "after 120 s" not in said
