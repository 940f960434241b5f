"""The GPU stack in a real lab cluster (issue 13, point 6): one control plane and two "GPU"
workers of the kubernetes flavour, air-gapped behind the lab mirror, the Kubernetes built
from Go modules and helm built from its Go module. The GPU Operator's chart, images and
controller are TEST DOUBLES (tests/doubles/: the chart with a closed values schema that helm
enforces, busybox images under every planned operand name, a controller that acts on the lab
cluster from the ClusterPolicy and each node's double hardware). Real: helm template, the
mirror, every pull of an operand image by containerd, the API server's server-side apply,
scheduling on extended resources, and gpuboot's waits and reports.

gpu1 is time-sliced (an L40S x2, 4 replicas), gpu2 is MIG (an H100 x2, all-1g.10gb, mixed
strategy); their GPU settings live in host_vars/ beside the inventory, as operators write them.
gpu1 does not declare its GPU count: its node carries a double PCI tree (tests/doubles/hardware)
that preflight's discovery reads, and the gate takes the count found there."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from gpuboot.cli.main import run
from gpuboot_lab.cluster import LabSpec, container_name
from tests.doubles.gpu_operator.operator import FAULT_DIR, DoubleGpuOperator, Hardware
from tests.doubles.hardware.sysfs import build_tree, hgx_server
from tests.integration.conftest import ssh
from tests.support.addon_doubles import add_to_bundle
from tests.support.addon_lab import addon_lab, kubectl, said
from tests.support.reuse import reuse_module

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NAME = "gstack"
SUBNET = "10.213.83.0/24"
RELEASE = "k8s-1.36"
GPU_NODES = {
    f"{NAME}-gpu1": ({"os": "debian-12", "gpu": {"model": "L40S-48GB", "driver": "preinstalled",
                                                 "time_slicing_replicas": 4}},
                     Hardware("NVIDIA-L40S", "0x26b9", 2, "ada-lovelace")),
    f"{NAME}-gpu2": ({"os": "debian-12", "gpu": {"model": "H100-SXM5-80GB", "count": 2, "driver": "preinstalled",
                                                 "mig": {"layout": "all-1g.10gb"}}},
                     Hardware("NVIDIA-H100-80GB-HBM3", "0x2330", 2)),
}
# gpu1's double PCI tree: 2 L40S (PCI device 0x26b9), read by preflight's discovery through the
# lab-only role inputs below (the other lab GPU node has no tree and expects no GPU there).
DOUBLE_ROOT = "/srv/gpuboot-double"
COUNTED_BY_DISCOVERY = f"{NAME}-gpu1"
DISCOVERY_VARS = {"preflight_sys_root": f"{DOUBLE_ROOT}/sys", "preflight_proc_root": f"{DOUBLE_ROOT}/proc",
                  "preflight_expect_gpu": True}


@pytest.fixture(scope="module")
def reused(request):
    """The whole module is skipped as REUSED while nothing it depends on changed since it passed
    on this machine (tests/support/reuse.py; GPUBOOT_TESTS_FRESH=1 runs it)."""
    yield from reuse_module(request)


@pytest.fixture
def gpu_cluster(reused, lab_required, tmp_path, monkeypatch, capsys):
    spec = LabSpec(name=NAME, control_planes=1, workers=0, gpu_workers=2, subnet=SUBNET, flavour="kubernetes",
                   release=RELEASE)
    with addon_lab(tmp_path, monkeypatch, capsys, spec) as node_lab:
        data = node_lab.settings()
        data["all"]["vars"]["gpuboot"]["gpu_operator"] = {"mig_strategy": "mixed"}
        # A broken operand must be reported within the test's patience, not the product's 15 min.
        data["all"]["vars"]["gpu_operator_ready_timeout"] = 40
        node_lab.write(data)
        host_vars = node_lab.inventory.parent / "host_vars"
        host_vars.mkdir()
        for name, (node, _) in GPU_NODES.items():
            extra = DISCOVERY_VARS if name == COUNTED_BY_DISCOVERY else {}
            (host_vars / f"{name}.yml").write_text(yaml.safe_dump({"gpuboot_node": node, **extra}))
        tree = tmp_path / "l40s"
        build_tree(hgx_server(gpu_device="0x26b9", gpus=2, nvswitches=0, connectx=0), tree)
        copied = subprocess.run(["podman", "cp", str(tree), f"{container_name(NAME, COUNTED_BY_DISCOVERY)}:{DOUBLE_ROOT}"],
                                capture_output=True, text=True)
        assert copied.returncode == 0, copied.stderr
        images = add_to_bundle(node_lab.bundle, node_lab.inventory, node_lab.helm)
        mirror = node_lab.start_mirror()
        with DoubleGpuOperator(node_lab.kubectl, node_lab.kubeconfig,
                               {n: hw for n, (_, hw) in GPU_NODES.items()}) as operator:
            yield node_lab.info(images=images, operator=operator, mirror=mirror)


def changes(info) -> dict[str, int]:
    record = json.loads((info["kubeconfig"].parent / "state.json").read_text())["phases"]
    return {name: entry["changed"] for name, entry in record.items()}


def test_gpu_operator_installs_from_the_mirror_and_the_nodes_advertise_what_the_inventory_asks(gpu_cluster,
                                                                                              capsys):
    info = gpu_cluster
    # --skip-mirror-check: this lab's nodes install containerd from Debian, so the package half
    # of the air-gap preflight cannot pass here (the image half is shown in test_mirror_airgap).
    # Every image still comes only from the mirror.
    assert run(["up", str(info["inventory"]), "--to", "validate", "--skip-mirror-check"]) == 0, said(capsys)
    capsys.readouterr()

    # The gate's report: every check passed, a smoke Job ran on each GPU node group, and a pod
    # on one node reached a pod on another.
    report = json.loads((info["kubeconfig"].parent / "validate.json").read_text())
    assert report["short"] == 0, report
    checks = {(r["node"], r["check"]) for r in report["rows"]}
    assert (f"{NAME}-gpu1", "allocatable") in checks and (f"{NAME}-gpu2", "allocatable") in checks
    # gpu1's count is the 2 GPUs discovery found on its PCI bus, times its 4 replicas.
    counted = next(r for r in report["rows"] if r["node"] == COUNTED_BY_DISCOVERY and r["check"] == "allocatable")
    assert counted["want"] == "nvidia.com/gpu=8 (2 GPU(s) found on the node)" and counted["ok"], counted
    assert (f"{NAME}-gpu1", "smoke nvidia.com/gpu=1 nvidia-smi") in checks
    assert (f"{NAME}-gpu2", "smoke nvidia.com/mig-1g.10gb=1 nvidia-smi") in checks
    assert ("-", "ClusterPolicy") in checks and any(c == "pod network" for _, c in checks)

    # Resources as the inventory asks: 2 L40S x 4 replicas; 2 H100 x 7 1g.10gb (mixed strategy).
    nodes = {n["metadata"]["name"]: n for n in json.loads(kubectl(info, "get", "nodes", "-o", "json"))["items"]}
    gpu1, gpu2 = (nodes[f"{NAME}-gpu{i}"] for i in (1, 2))
    assert gpu1["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert gpu2["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "14"
    assert "nvidia.com/gpu" not in gpu2["status"]["allocatable"]
    # The labels gpuboot applied (server-side, its own field manager) picked those profiles.
    assert gpu1["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "time-sliced-4"
    assert gpu1["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L40S-SHARED"
    assert gpu2["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"
    assert all(n["metadata"]["labels"]["nvidia.com/gpu.deploy.driver"] == "false" for n in (gpu1, gpu2))

    # The ClusterPolicy the chart rendered: open modules never asked of a preinstalled driver,
    # how the toolkit reaches containerd, the MIG strategy; the namespace admits privileged operands.
    policy = json.loads(kubectl(info, "get", "clusterpolicies.nvidia.com", "cluster-policy", "-o", "json"))
    assert policy["status"]["state"] == "ready"
    assert policy["spec"]["driver"]["enabled"] is False and policy["spec"]["mig"]["strategy"] == "mixed"
    # containerd 2.3 with operator 26.7: the toolkit is an NRI plugin and owns nothing of containerd.
    assert policy["spec"]["cdi"] == {"enabled": True, "nriPluginEnabled": True}
    assert "env" not in policy["spec"]["toolkit"]
    namespace = json.loads(kubectl(info, "get", "namespace", "gpu-operator", "-o", "json"))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    # No Helm release: the objects were applied by gpuboot, as Argo CD will declare them.
    assert "helm.sh/release.v1" not in kubectl(info, "get", "secrets", "-n", "gpu-operator", "-o", "yaml")
    shown = json.loads(kubectl(info, "get", "clusterpolicies.nvidia.com", "cluster-policy", "-o", "json",
                               "--show-managed-fields"))
    assert "gpuboot" in {m["manager"] for m in shown["metadata"]["managedFields"]}

    # Every operand pod runs on both GPU nodes, pulled through the mirror by containerd, and
    # only images the mirror plan listed exist there to be pulled.
    pods = json.loads(kubectl(info, "get", "pods", "-n", "gpu-operator", "-o", "json"))["items"]
    for pod in pods:
        assert all(c["ready"] for c in pod["status"]["containerStatuses"]), pod["metadata"]["name"]
        for container in pod["spec"]["containers"]:
            assert container["image"] in info["images"], container["image"]
    per_node = {n: {p["metadata"]["labels"].get("app") for p in pods if p["spec"].get("nodeName") == n}
                for n in (f"{NAME}-gpu1", f"{NAME}-gpu2")}
    assert {"nvidia-device-plugin-daemonset", "nvidia-container-toolkit-daemonset"} <= per_node[f"{NAME}-gpu1"]
    assert "nvidia-mig-manager" in per_node[f"{NAME}-gpu2"] and "nvidia-mig-manager" not in per_node[f"{NAME}-gpu1"]
    assert "nvidia-driver-daemonset" not in set().union(*per_node.values())  # preinstalled drivers
    pulled = ssh({"lab": info["lab"], "state": info["state"]}, f"{NAME}-gpu1",
                 "crictl --runtime-endpoint unix:///run/containerd/containerd.sock images -o json 2>/dev/null "
                 "|| ctr -n k8s.io images ls -q")
    assert "k8s-device-plugin" in pulled.stdout
    # The toolkit's pod is Ready only where containerd's NRI socket is there (the double checks
    # it as the real plugin needs it), and no drop-in of the toolkit's exists on the node.
    for node in (f"{NAME}-gpu1", f"{NAME}-gpu2"):
        seen = ssh({"lab": info["lab"], "state": info["state"]}, node,
                   "test -S /var/run/nri/nri.sock && echo nri; ls /etc/containerd/conf.d")
        assert seen.stdout.split() == ["nri"], (node, seen.stdout, seen.stderr)

    # A second up changes nothing: the chart renders the same, the server-side diffs are empty.
    assert run(["up", str(info["inventory"]), "--from", "gpu_operator", "--to", "gpu_operator", "--force",
                "--skip-mirror-check"]) == 0, \
        said(capsys)
    assert changes(info)["gpu_operator"] == 0
    # An object edited behind gpuboot's back is put back by the next up.
    kubectl(info, "-n", "gpu-operator", "delete", "configmap", "gpuboot-device-plugin-config")
    assert run(["up", str(info["inventory"]), "--from", "gpu_operator", "--to", "gpu_operator", "--force",
                "--skip-mirror-check"]) == 0
    assert changes(info)["gpu_operator"] > 0
    kubectl(info, "-n", "gpu-operator", "get", "configmap", "gpuboot-device-plugin-config")
    capsys.readouterr()

    # A broken operand on one node: the wait stops naming the node, the pod and the reason.
    lab = {"lab": info["lab"], "state": info["state"]}
    ssh(lab, f"{NAME}-gpu2", f"mkdir -p {FAULT_DIR} && echo 'double: device plugin cannot open /dev/nvidia0' "
                             f"> {FAULT_DIR}/fault-device-plugin")
    kubectl(info, "-n", "gpu-operator", "delete", "pod", "-l", "app=nvidia-device-plugin-daemonset",
            "--field-selector", f"spec.nodeName={NAME}-gpu2", "--wait=false")
    deadline = time.monotonic() + 90
    while json.loads(kubectl(info, "get", "clusterpolicies.nvidia.com", "cluster-policy", "-o", "json")
                     )["status"]["state"] != "notReady":
        assert time.monotonic() < deadline, "the double operator did not see the broken operand"
        time.sleep(3)
    assert run(["up", str(info["inventory"]), "--from", "gpu_operator", "--to", "gpu_operator", "--force",
                "--skip-mirror-check"]) != 0
    stopped = said(capsys)
    assert f"{NAME}-gpu2: nvidia-device-plugin-daemonset-" in stopped, stopped
    assert "cannot open /dev/nvidia0" in stopped or "CrashLoopBackOff" in stopped or "Error" in stopped, stopped
    # `gpuboot verify` (the gate on its own) fails too, its JSON report naming node, operand, reason.
    assert run(["verify", str(info["inventory"]), "--output", "json"]) != 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    report = next(e for e in lines if e.get("event") == "ValidationReport")
    short = [r for r in report["rows"] if not r["ok"]]
    assert any(r["node"] == f"{NAME}-gpu2" and r["check"] == "operand nvidia-device-plugin-daemonset" for r in short), short
    assert ("-", "ClusterPolicy") in {(r["node"], r["check"]) for r in short}
    assert all(r["node"] != f"{NAME}-gpu1" or r["check"] == "ClusterPolicy" for r in short), short
