"""The GPU stack in a real lab cluster, with NVIDIA's real GPU Operator (issue 13, point 6; issue
29, points 3 and 4): one control plane and two GPU workers of the kubernetes flavour, air-gapped
behind the lab mirror, the Kubernetes built from Go modules and helm from its Go module. The
GPU Operator's real chart at the tag the release pins, packaged by the real helm from the
source tree; its controller, NFD, the validator and the device plugin's config-manager built
from their sources (`gpuboot_lab.operators`); installed by gpuboot's gpu_operator phase. Each GPU
node declares its double hardware to the real NFD through a local feature file. TEST DOUBLES
stand only where a GPU is needed (tests/support/gpu_operands.py): the driver, the container
toolkit, the device plugin, GFD, the DCGM exporter, the MIG manager and the validator's CUDA
sample.

gpu1 is time-sliced (an L40S x2, 4 replicas), gpu2 is MIG (an H100 x2, all-1g.10gb, mixed
strategy); their GPU settings live in host_vars/ beside the inventory, as operators write them.
gpu1 does not declare its GPU count: its node carries a double PCI tree (tests/doubles/hardware)
that preflight's discovery reads, and the gate takes the count found there.

What it shows: the real operator, fed gpuboot's ClusterPolicy, deploys exactly the operands that
policy turns on, on the GPU nodes only (the MIG manager where GFD found MIG-capable GPUs), from
exactly the images gpuboot's mirror plan holds; the real validator passes the driver, toolkit,
CUDA and device-plugin validations; the MIG manager applies gpuboot's layout with the GPU
clients paused; the kubelet then allocates 8 time-sliced GPUs and 14 MIG devices; the gate's
report; a second up changes nothing; a deleted object is put back; a GPU node whose driver
lost its GPUs makes the wait and `gpuboot verify` name the node, the operand and the reason.
What the cluster showed is kept in the test's tmp directory."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.mirror import plan as mirror_plan
from gpuboot.mirror.refs import parse_image
from gpuboot_lab.cluster import LabSpec, container_name
from tests.doubles.hardware.sysfs import build_tree, hgx_server
from tests.integration.conftest import ssh
from tests.support import gpu_operands, real_gpu_operator
from tests.support.addon_lab import addon_lab, kubectl, phase_changes, said
from tests.support.reuse import reuse_module

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NAME = "gstack"
SPEC = LabSpec(name=NAME, control_planes=1, workers=0, gpu_workers=2, subnet="10.213.83.0/24", flavour="kubernetes",
               release="k8s-1.36")
SHARED_NODE, MIG_NODE = f"{NAME}-gpu1", f"{NAME}-gpu2"
GPUS, REPLICAS, MIG_LAYOUT, MIG_PER_GPU = 2, 4, "all-1g.10gb", 7
GPU_SETTINGS = {
    SHARED_NODE: {"os": "debian-12", "gpu": {"model": "L40S-48GB", "driver": "preinstalled",
                                             "time_slicing_replicas": REPLICAS}},
    MIG_NODE: {"os": "debian-12", "gpu": {"model": "H100-SXM5-80GB", "count": GPUS, "driver": "preinstalled",
                                          "mig": {"layout": MIG_LAYOUT}}},
}
# What the preinstalled driver's double says NVML reports on each node.
HARDWARE = {
    SHARED_NODE: gpu_operands.double_gpus("NVIDIA L40S", GPUS, family="ada-lovelace", mig_capable=False,
                                          memory_mib=46068),
    MIG_NODE: gpu_operands.double_gpus("NVIDIA H100 80GB HBM3", GPUS, family="hopper", mig_capable=True,
                                       memory_mib=81559, pci_device_id="0x233010DE"),
}
# gpu1's double PCI tree: 2 L40S (PCI device 0x26b9), read by preflight's discovery through the
# lab-only role inputs below (the other GPU node declares its count).
DOUBLE_ROOT = "/srv/gpuboot-double"
DISCOVERY_VARS = {"preflight_sys_root": f"{DOUBLE_ROOT}/sys", "preflight_proc_root": f"{DOUBLE_ROOT}/proc",
                  "preflight_expect_gpu": True}
# ClusterPolicy section -> the DaemonSet NVIDIA's operator deploys for it (its assets/ at the tag).
OPERAND_DAEMONSETS = {
    "driver": "nvidia-driver-daemonset",
    "toolkit": "nvidia-container-toolkit-daemonset",
    "devicePlugin": "nvidia-device-plugin-daemonset",
    "dcgmExporter": "nvidia-dcgm-exporter",
    "gfd": "gpu-feature-discovery",
    "migManager": "nvidia-mig-manager",
}
# The validator has no switch: the operator always deploys it.
VALIDATOR = "nvidia-operator-validator"
# Planned for gpuboot itself, not for the operator: validate's nvidia-smi Job.
GPUBOOT_OWN = ("smokeTest",)


@pytest.fixture(scope="module")
def reused(request):
    """The whole module is skipped as REUSED while nothing it depends on changed since it passed
    on this machine (tests/support/reuse.py; GPUBOOT_TESTS_FRESH=1 runs it). The upstream
    builds are keyed there too: by the tags the release matrix (mirror/) pins."""
    yield from reuse_module(request)


@pytest.fixture
def gpu_cluster(reused, lab_required, tmp_path, monkeypatch, capsys):
    release = matrix.load(SPEC.release)
    with addon_lab(tmp_path, monkeypatch, capsys, SPEC) as node_lab:
        data = node_lab.settings()
        # A lab node has no NVIDIA kernel module, so no device majors in /proc/devices for the
        # validator's /dev/char links: NVIDIA's documented switch for such hosts.
        data["all"]["vars"]["gpuboot"]["gpu_operator"] = {"mig_strategy": "mixed", "dev_char_symlinks": False}
        # The DCGM exporter's probes wait 45 s; the validator's workloads run one after another.
        data["all"]["vars"]["gpu_operator_ready_timeout"] = 420
        node_lab.write(data)
        host_vars = node_lab.inventory.parent / "host_vars"
        host_vars.mkdir()
        for name, node in GPU_SETTINGS.items():
            extra = DISCOVERY_VARS if name == SHARED_NODE else {}
            (host_vars / f"{name}.yml").write_text(yaml.safe_dump({"gpuboot_node": node, **extra}))
        tree = tmp_path / "l40s"
        build_tree(hgx_server(gpu_device="0x26b9", gpus=GPUS, nvswitches=0, connectx=0), tree)
        copied = subprocess.run(["podman", "cp", str(tree), f"{container_name(NAME, SHARED_NODE)}:{DOUBLE_ROOT}"],
                                capture_output=True, text=True)
        assert copied.returncode == 0, copied.stderr
        images = real_gpu_operator.into_bundle(node_lab, release)
        mirror = node_lab.start_mirror()
        real_gpu_operator.declare_hardware(node_lab.info(), HARDWARE)
        out = tmp_path / "seen"
        out.mkdir()
        info = node_lab.info(images=images, mirror=mirror, release=release, out=out)
        try:
            yield info
        finally:
            real_gpu_operator.keep(out, info)


def get(info, *args: str, namespace: tuple[str, ...] = ("-n", "gpu-operator")) -> list[dict]:
    found = json.loads(kubectl(info, *namespace, "get", *args, "-o", "json"))
    return found.get("items", [found])


def images_of(workloads: list[dict]) -> set[str]:
    return {c["image"] for w in workloads for key in ("containers", "initContainers")
            for c in w["spec"]["template"]["spec"].get(key, [])}


def force_gpu_operator(info) -> int:
    return run(["up", str(info["inventory"]), "--from", "gpu_operator", "--to", "gpu_operator", "--force",
                "--skip-mirror-check"])


def test_the_real_gpu_operator_installs_from_the_mirror_and_the_nodes_advertise_what_the_inventory_asks(
        gpu_cluster, capsys):
    info = gpu_cluster
    seen = f"(what the cluster showed: {info['out']}, kept at the test's end)"
    # --skip-mirror-check: this lab's nodes install containerd from Debian, so the package half
    # of the air-gap preflight cannot pass here (the image half is shown in test_mirror_airgap).
    # Every image still comes only from the mirror.
    code = run(["up", str(info["inventory"]), "--to", "validate", "--skip-mirror-check"])
    told = said(capsys)
    (info["out"] / "up.txt").write_text(f"exit {code}\n{told}")
    assert code == 0, (told, seen)

    # The gate's report: every check passed, a smoke Job ran on each GPU node group, and a pod
    # on one node reached a pod on another.
    report = json.loads((info["kubeconfig"].parent / "validate.json").read_text())
    assert report["short"] == 0, report
    checks = {(r["node"], r["check"]) for r in report["rows"]}
    assert (SHARED_NODE, "allocatable") in checks and (MIG_NODE, "allocatable") in checks
    # gpu1's count is the 2 GPUs discovery found on its PCI bus, times its 4 replicas.
    counted = next(r for r in report["rows"] if r["node"] == SHARED_NODE and r["check"] == "allocatable")
    assert counted["want"] == f"nvidia.com/gpu={GPUS * REPLICAS} ({GPUS} GPU(s) found on the node)" and counted["ok"], \
        counted
    assert (SHARED_NODE, "smoke nvidia.com/gpu=1 nvidia-smi") in checks
    assert (MIG_NODE, "smoke nvidia.com/mig-1g.10gb=1 nvidia-smi") in checks
    assert ("-", "ClusterPolicy") in checks and any(c == "pod network" for _, c in checks)

    # The operator: ready with reason Reconciled, the operands gpuboot's ClusterPolicy turns on
    # and no others of those it can turn off, on the GPU nodes only (NFD's worker runs on every
    # node), the MIG manager only where GFD found MIG-capable GPUs.
    cluster_policy = get(info, "clusterpolicies.nvidia.com")[0]
    policy = cluster_policy["spec"]
    ready = next(c for c in cluster_policy["status"]["conditions"] if c["type"] == "Ready")
    assert (cluster_policy["status"]["state"], ready["reason"]) == ("ready", "Reconciled"), seen
    workloads = get(info, "daemonsets,deployments,jobs")
    pods = get(info, "pods")
    daemonsets = {w["metadata"]["name"] for w in workloads if w["kind"] == "DaemonSet"}
    wanted = {ds for key, ds in OPERAND_DAEMONSETS.items() if policy[key]["enabled"]} | {VALIDATOR}
    assert {ds for ds in daemonsets if ds in wanted or ds in OPERAND_DAEMONSETS.values()} == wanted, seen
    operand_pods = [p for p in pods if any(r["kind"] == "DaemonSet" and r["name"] in wanted
                                           for r in p["metadata"].get("ownerReferences", []))]
    per_node: dict[str, set[str]] = {}
    for pod in operand_pods:
        per_node.setdefault(pod["spec"].get("nodeName"), set()).update(r["name"] for r in pod["metadata"]["ownerReferences"])
    assert per_node == {SHARED_NODE: wanted - {OPERAND_DAEMONSETS["migManager"]}, MIG_NODE: wanted}, (per_node, seen)

    # What the operator deployed is what gpuboot's mirror plan holds for it: one image too
    # many in the plan is an air gap's waste, one too few a pod that never pulls.
    release = info["release"]
    plan = mirror_plan.build(release, mirror_plan.Target.of(load_cluster(info["inventory"]), release)).only({"gpu_operator"})
    deployed = images_of(workloads)
    own = {str(parse_image(release.images["gpu_operator"][key])) for key in GPUBOOT_OWN}
    planned = {str(image.ref) for image in plan.images} - own
    assert deployed == planned, (sorted(deployed - planned), sorted(planned - deployed), seen)
    # Every running pod is ready, pulled through the mirror by containerd from an image the
    # plan listed (the validator's workload pods have completed).
    for pod in pods:
        if pod["status"].get("phase") == "Running":
            assert all(c["ready"] for c in pod["status"]["containerStatuses"]), (pod["metadata"]["name"], seen)
        for container in pod["spec"]["containers"]:
            assert container["image"] in info["images"], container["image"]
    pulled = ssh(info, SHARED_NODE, "crictl --runtime-endpoint unix:///run/containerd/containerd.sock images -o json "
                                    "2>/dev/null || ctr -n k8s.io images ls -q")
    assert "k8s-device-plugin" in pulled.stdout

    # Resources as the inventory asks, from the kubelet (the device plugin double registered
    # them): 2 L40S x 4 replicas; 2 H100 x 7 1g.10gb (mixed strategy).
    nodes = {n["metadata"]["name"]: n for n in get(info, "nodes", namespace=())}
    shared, mig = nodes[SHARED_NODE], nodes[MIG_NODE]
    assert shared["status"]["allocatable"]["nvidia.com/gpu"] == str(GPUS * REPLICAS), seen
    assert mig["status"]["allocatable"].get("nvidia.com/mig-1g.10gb") == str(GPUS * MIG_PER_GPU), seen
    assert mig["status"]["allocatable"].get("nvidia.com/gpu", "0") == "0", seen
    # The labels gpuboot applied picked those profiles; GFD's reached the nodes through the
    # real NFD; the preinstalled drivers' label survived the operator's first pass over nodes
    # NFD had not yet labelled (it strips every gpu.deploy.* label there): gpuboot put it back.
    labels = {name: node["metadata"]["labels"] for name, node in nodes.items()}
    assert labels[SHARED_NODE]["nvidia.com/device-plugin.config"] == f"time-sliced-{REPLICAS}"
    assert labels[SHARED_NODE].get("nvidia.com/gpu.product") == "NVIDIA-L40S-SHARED", seen
    assert labels[SHARED_NODE].get("nvidia.com/mig.capable") == "false", seen
    assert all(labels[n]["nvidia.com/gpu.deploy.driver"] == "false" for n in HARDWARE), seen
    # The MIG manager applied the layout gpuboot's label names (the phase waited for its state)
    # and gave the GPU clients back.
    assert (labels[MIG_NODE]["nvidia.com/mig.config"], labels[MIG_NODE].get("nvidia.com/mig.config.state")) == \
        (MIG_LAYOUT, "success"), (labels[MIG_NODE], seen)
    assert (labels[MIG_NODE].get("nvidia.com/mig.capable"), labels[MIG_NODE].get("nvidia.com/mig.strategy")) == \
        ("true", "mixed"), seen
    assert {labels[MIG_NODE].get(f"nvidia.com/gpu.deploy.{client}")
            for client in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter")} == {"true"}, seen
    applied = json.loads(ssh(info, MIG_NODE, f"cat {gpu_operands.HARDWARE}").stdout)
    assert [len(gpu.get("mig", [])) for gpu in applied["gpus"]] == [MIG_PER_GPU] * GPUS, (applied, seen)
    # The validator wrote every validation it makes, on each node (on the MIG node again after
    # the MIG manager restarted it).
    for name in HARDWARE:
        written = ssh(info, name, "ls /run/nvidia/validations").stdout.split()
        assert {"driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready"} <= set(written), (name, written, seen)

    # The ClusterPolicy the real chart rendered: no driver for preinstalled ones, the MIG
    # strategy, containerd 2.3 with operator 26.7: the toolkit is an NRI plugin and owns nothing
    # of containerd; the namespace admits privileged operands.
    assert policy["driver"]["enabled"] is False and policy["mig"]["strategy"] == "mixed"
    assert (policy["cdi"]["enabled"], policy["cdi"]["nriPluginEnabled"]) == (True, True), policy["cdi"]
    assert not policy["toolkit"].get("env"), policy["toolkit"]
    namespace = json.loads(kubectl(info, "get", "namespace", "gpu-operator", "-o", "json"))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    # No Helm release: the objects were applied by gpuboot, as Argo CD will declare them.
    assert "helm.sh/release.v1" not in kubectl(info, "get", "secrets", "-n", "gpu-operator", "-o", "yaml")
    shown = json.loads(kubectl(info, "get", "clusterpolicies.nvidia.com", "cluster-policy", "-o", "json",
                               "--show-managed-fields"))
    assert "gpuboot" in {m["manager"] for m in shown["metadata"]["managedFields"]}
    # The chart's delete hooks never ran: NFD's prune Job would strip the NFD labels, the
    # cleanup Jobs delete the operator's own custom resources.
    jobs = {w["metadata"]["name"] for w in workloads if w["kind"] == "Job"}
    assert not {job for job in jobs if job.endswith(("-prune", "-cleanup-crd", "-cleanup-gpucluster"))}, (jobs, seen)
    # The toolkit's pod is Ready only where containerd's NRI socket is there (the double checks
    # it as the real plugin needs it), and no drop-in of the toolkit's exists on the node.
    for node in HARDWARE:
        found = ssh(info, node, "test -S /var/run/nri/nri.sock && echo nri; ls /etc/containerd/conf.d")
        assert found.stdout.split() == ["nri"], (node, found.stdout, found.stderr)

    # The phase run again (forced: a plain up skips it as converged) changes nothing: the chart
    # renders the same, the server-side diffs are empty, the labels put back are gpuboot's for
    # good, and no hook is applied again.
    assert force_gpu_operator(info) == 0, said(capsys)
    assert phase_changes(info)["gpu_operator"] == 0, seen
    # An object deleted behind gpuboot's back is put back by the next up.
    kubectl(info, "-n", "gpu-operator", "delete", "configmap", "gpuboot-device-plugin-config")
    assert force_gpu_operator(info) == 0, said(capsys)
    assert phase_changes(info)["gpu_operator"] > 0
    kubectl(info, "-n", "gpu-operator", "get", "configmap", "gpuboot-device-plugin-config")
    capsys.readouterr()

    # gpu1's driver loses its GPUs (NVML finds none: the double's hardware file is gone, as
    # after a GPU fell off the bus): its device plugin fails, the real operator says notReady,
    # and the wait stops naming the node, the pod and the reason, within a patience shorter
    # than the product's.
    ssh(info, SHARED_NODE, f"mv {gpu_operands.HARDWARE} {gpu_operands.HARDWARE}.lost")
    kubectl(info, "-n", "gpu-operator", "delete", "pod", "-l", "app=nvidia-device-plugin-daemonset",
            "--field-selector", f"spec.nodeName={SHARED_NODE}", "--wait=false")
    deadline = time.monotonic() + 300
    while get(info, "clusterpolicies.nvidia.com")[0]["status"]["state"] != "notReady":
        assert time.monotonic() < deadline, f"the real operator did not see the broken operand {seen}"
        time.sleep(5)
    # The test's patience, not the product's: the wait, and the gate's smoke Job that cannot be
    # scheduled on the broken node.
    data = yaml.safe_load(info["inventory"].read_text())
    data["all"]["vars"].update(gpu_operator_ready_timeout=60, validate_timeout=45)
    info["inventory"].write_text(yaml.safe_dump(data, sort_keys=False))
    assert force_gpu_operator(info) != 0
    stopped = said(capsys)
    assert f"{SHARED_NODE}: nvidia-device-plugin-daemonset-" in stopped, stopped
    assert "CrashLoopBackOff" in stopped or "Error" in stopped or "no NVML" in stopped, stopped
    # `gpuboot verify` (the gate on its own) fails too, its JSON report naming node, operand, reason.
    assert run(["verify", str(info["inventory"]), "--output", "json"]) != 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    report = next(e for e in lines if e.get("event") == "ValidationReport")
    short = [r for r in report["rows"] if not r["ok"]]
    assert any(r["node"] == SHARED_NODE and r["check"] == "operand nvidia-device-plugin-daemonset" for r in short), short
    assert ("-", "ClusterPolicy") in {(r["node"], r["check"]) for r in short}
    assert all(r["node"] != MIG_NODE or r["check"] == "ClusterPolicy" for r in short), short
