"""NVIDIA's GPU Operator for real in a lab cluster: its real chart from the source tree at the
tag the release pins, its controller and NFD built from their sources (`gpuboot_lab.operators`),
installed by gpuboot's gpu_operator phase through the air-gapped lab mirror onto a kubeadm
cluster whose GPU node declares its double hardware to the real NFD through a local feature
file. Doubles stand only where a GPU is needed (tests/support/gpu_operands.py): the driver, the
container toolkit, the device plugin, GFD, the DCGM exporter, the MIG manager and the validator's
CUDA sample.

What it shows: the real operator, fed gpuboot's ClusterPolicy, deploys exactly the operands that
policy turns on, on the GPU node only, from exactly the images gpuboot's mirror plan holds; the
real validator passes the driver, toolkit, CUDA and device-plugin validations through the
doubles; the operator says Ready with reason Reconciled and gpuboot's phase is done; the GPUs
are allocatable from the kubelet and GFD's labels reach the node through the real NFD. The
second GPU node is MIG (two H100, all-1g.10gb, mixed strategy): the operator deploys the MIG
manager there only, which applies the layout gpuboot's label names with the GPU clients paused,
and the kubelet then allocates its MIG devices. What each pod printed is kept in the test's tmp
directory."""
from __future__ import annotations

import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.mirror import plan as mirror_plan
from gpuboot.mirror.bundle import Bundle
from gpuboot.mirror.plan import PlannedChart
from gpuboot.mirror.pull import chart_artifact
from gpuboot.mirror.refs import parse_image
from gpuboot_lab.cluster import LabSpec
from tests.integration.conftest import ssh
from tests.integration.test_double_schemas_vs_real_charts import source_tree
from tests.support import gpu_operands
from tests.support.addon_doubles import add_to_bundle
from tests.support.addon_lab import addon_lab

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# A control plane and two GPU workers, kubeadm's, in a subnet of their own.
SPEC = LabSpec(name="rgpu", control_planes=1, workers=0, gpu_workers=2, subnet="10.213.88.0/24", flavour="kubernetes",
               release="k8s-1.36")
GPU_NODE = f"{SPEC.name}-gpu1"
MIG_NODE = f"{SPEC.name}-gpu2"
# NFD's local source: a feature file under features.d labels the node as if its PCI scan found
# an NVIDIA device (class 0302, vendor 10de), which is what the operator selects GPU nodes by.
FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/gpuboot-double-hardware"
DOUBLE_FEATURES = "pci-10de.present=true\npci-0302_10de.present=true\n"


def real_chart(helm: Path, release: matrix.Release, into: Path) -> tuple[str, bytes]:
    """(version, archive) of the GPU Operator's chart at the release's tag, packaged by the real helm."""
    version = release.gpu_operator["chart"]["version"]
    upstream, git_dir, tag = source_tree("gpu-operator", version, SPEC.release)
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", tag, upstream.chart_dir],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    packaged = subprocess.run([str(helm), "package", str(into / upstream.chart_dir), "--version", version,
                               "--app-version", version, "--destination", str(into)],
                              capture_output=True, text=True)
    assert packaged.returncode == 0, packaged.stderr
    return version, next(into.glob("gpu-operator-*.tgz")).read_bytes()


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
# The GPU nodes' double hardware: two L40S (whole GPUs); two H100 (MIG, 7 x 1g.10gb each).
GPUS = 2
DOUBLE_GPUS = gpu_operands.double_gpus("NVIDIA L40S", GPUS, family="ada-lovelace", mig_capable=False, memory_mib=46068)
MIG_LAYOUT, MIG_PER_GPU = "all-1g.10gb", 7
DOUBLE_MIG_GPUS = gpu_operands.double_gpus("NVIDIA H100 80GB HBM3", GPUS, family="hopper", mig_capable=True,
                                           memory_mib=81559, pci_device_id="0x233010DE")
HARDWARE = {GPU_NODE: DOUBLE_GPUS, MIG_NODE: DOUBLE_MIG_GPUS}


def images_of(workloads: list[dict]) -> set[str]:
    return {c["image"] for w in workloads for key in ("containers", "initContainers")
            for c in w["spec"]["template"]["spec"].get(key, [])}


def keep(out: Path, kubectl: list[str]) -> None:
    """What the cluster showed, for whoever reads a failure (or the next double's needs)."""
    for label, args in {
        "clusterpolicy": ["get", "clusterpolicies.nvidia.com", "-o", "yaml"],
        "workloads": ["get", "ds,deploy,pods,jobs", "-A", "-o", "wide"],
        "events": ["get", "events", "-A", "--sort-by=.lastTimestamp"],
        "operator-log": ["-n", "gpu-operator", "logs", "deploy/gpu-operator", "--tail=400"],
    }.items():
        done = subprocess.run([*kubectl, *args], capture_output=True, text=True, timeout=60)
        (out / f"{label}.txt").write_text(done.stdout + done.stderr)
    names = subprocess.run([*kubectl, "-n", "gpu-operator", "get", "pods", "-o", "name"], capture_output=True,
                           text=True, timeout=60).stdout.split()
    for pod in names:
        done = subprocess.run([*kubectl, "-n", "gpu-operator", "logs", pod, "--all-containers", "--tail=100"],
                              capture_output=True, text=True, timeout=60)
        (out / f"log-{pod.split('/')[-1]}.txt").write_text(done.stdout + done.stderr)


def test_the_real_gpu_operator_reconciles_the_lab_s_gpu_node_to_ready(lab_required, tmp_path, monkeypatch, capsys):
    release = matrix.load(SPEC.release)
    out = tmp_path / "seen"
    out.mkdir()
    with addon_lab(tmp_path, monkeypatch, capsys, SPEC) as node_lab:
        data = node_lab.settings()
        # The DCGM exporter's probes wait 45 s; the validator's workloads run one after another.
        data["all"]["vars"]["gpu_operator_ready_timeout"] = 420
        # A lab node has no NVIDIA kernel module, so no device majors in /proc/devices for the
        # validator's /dev/char links: NVIDIA's documented switch for such hosts.
        data["all"]["vars"]["gpuboot"]["gpu_operator"] = {"dev_char_symlinks": False, "mig_strategy": "mixed"}
        node_lab.write(data)
        host_vars = node_lab.inventory.parent / "host_vars"
        host_vars.mkdir(exist_ok=True)
        (host_vars / f"{GPU_NODE}.yml").write_text(yaml.safe_dump({"gpuboot_node": {
            "os": "debian-12", "gpu": {"model": "L40S-48GB", "count": GPUS, "driver": "preinstalled"}}}))
        (host_vars / f"{MIG_NODE}.yml").write_text(yaml.safe_dump({"gpuboot_node": {
            "os": "debian-12", "gpu": {"model": "H100-SXM5-80GB", "count": GPUS, "driver": "preinstalled",
                                       "mig": {"layout": MIG_LAYOUT}}}}))
        # Doubles first (every planned image and the chart), then the real chart and the
        # images built from source, with the hardware's doubles, over them.
        add_to_bundle(node_lab.bundle, node_lab.inventory, node_lab.helm)
        bundle = Bundle(node_lab.bundle)
        name, artifacts = bundle.read_manifest()
        planned_chart = next(a for a in artifacts if a.kind == "chart" and "gpu-operator" in a.ref)
        with tempfile.TemporaryDirectory() as tmp:
            version, archive = real_chart(node_lab.helm, release, Path(tmp))
        chart = chart_artifact(bundle, PlannedChart("gpu_operator", planned_chart.ref.split("(")[-1].rstrip(")"),
                                                    "gpu-operator", version), archive)
        real = [chart, *gpu_operands.images(bundle, release)]
        replaced = {a.ref for a in real}
        bundle.write_manifest(name, [a for a in artifacts if a.ref not in replaced] + real)
        node_lab.start_mirror()
        # The preinstalled driver is hardware: its double, which the real validator runs through chroot /host.
        for node, gpus in HARDWARE.items():
            ssh(node_lab.info(), node, f"mkdir -p {Path(FEATURES).parent} && printf '{DOUBLE_FEATURES}' > {FEATURES}")
            for path, content, mode in gpu_operands.driver_files(gpus):
                ssh(node_lab.info(), node, f"mkdir -p {Path(path).parent} && cat > {path} && chmod {mode:o} {path}",
                    stdin=content)
        cluster = load_cluster(node_lab.inventory)
        plan = mirror_plan.build(release, mirror_plan.Target.of(cluster, release)).only({"gpu_operator"})

        code = run(["up", str(node_lab.inventory), "--to", "gpu_operator", "--skip-mirror-check"])
        said = capsys.readouterr()
        told = said.out + said.err
        (out / "up.txt").write_text(f"exit {code}\n{told}")
        kubectl = [str(node_lab.kubectl), "--kubeconfig", str(node_lab.kubeconfig), "--request-timeout=20s"]
        keep(out, kubectl)

        def get(*args: str, namespace: tuple[str, ...] = ("-n", "gpu-operator")) -> list[dict]:
            done = subprocess.run([*kubectl, *namespace, "get", *args, "-o", "json"], capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            found = json.loads(done.stdout)
            return found.get("items", [found])

        seen = f"(what the cluster showed: {out})"
        assert code == 0, (told[-4000:], seen)
        cluster_policy = get("clusterpolicies.nvidia.com")[0]
        policy = cluster_policy["spec"]
        ready = next(c for c in cluster_policy["status"]["conditions"] if c["type"] == "Ready")
        assert (cluster_policy["status"]["state"], ready["reason"]) == ("ready", "Reconciled"), seen
        workloads = get("daemonsets,deployments,jobs")
        pods = get("pods")
        daemonsets = {w["metadata"]["name"] for w in workloads if w["kind"] == "DaemonSet"}

        # The operands gpuboot's ClusterPolicy turns on, and no others of those it can turn off.
        wanted = {ds for key, ds in OPERAND_DAEMONSETS.items() if policy[key]["enabled"]} | {VALIDATOR}
        assert {ds for ds in daemonsets if ds in wanted or ds in OPERAND_DAEMONSETS.values()} == wanted, seen
        assert not policy["driver"]["enabled"]  # the node's driver is preinstalled
        # Every operand pod on the GPU nodes and nowhere else (NFD's worker runs on every node),
        # the MIG manager only where GFD found MIG-capable GPUs.
        operand_pods = [p for p in pods if any(r["kind"] == "DaemonSet" and r["name"] in wanted
                                               for r in p["metadata"].get("ownerReferences", []))]
        per_node: dict[str, set[str]] = {}
        for pod in operand_pods:
            per_node.setdefault(pod["spec"].get("nodeName"), set()).update(
                r["name"] for r in pod["metadata"]["ownerReferences"])
        assert per_node == {GPU_NODE: wanted - {OPERAND_DAEMONSETS["migManager"]}, MIG_NODE: wanted}, (per_node, seen)

        # What the operator deployed is what gpuboot's mirror plan holds for it: one image too
        # many in the plan is an air gap's waste, one too few a pod that never pulls.
        deployed = images_of(workloads)
        own = {str(parse_image(release.images["gpu_operator"][key])) for key in GPUBOOT_OWN}
        planned = {str(image.ref) for image in plan.images} - own
        assert deployed == planned, (sorted(deployed - planned), sorted(planned - deployed), seen)

        # The GPUs come from the kubelet (the device plugin double registered them), and GFD's
        # labels reached the node through its NodeFeature and the real NFD master.
        node = get("node", GPU_NODE, namespace=())[0]
        assert node["status"]["allocatable"].get("nvidia.com/gpu") == str(GPUS), seen
        labels = node["metadata"]["labels"]
        assert labels.get("nvidia.com/gpu.product") == "NVIDIA-L40S", seen
        assert (labels.get("nvidia.com/gpu.count"), labels.get("nvidia.com/mig.capable")) == (str(GPUS), "false"), seen
        # The preinstalled driver's label survived the operator's first pass over a node NFD had
        # not yet labelled (it strips every gpu.deploy.* label there): gpuboot put it back.
        assert labels.get("nvidia.com/gpu.deploy.driver") == "false", seen
        # The chart's delete hooks never ran: NFD's prune Job would strip the NFD labels, the
        # cleanup Jobs delete the operator's own custom resources.
        jobs = {w["metadata"]["name"] for w in workloads if w["kind"] == "Job"}
        assert not {job for job in jobs if job.endswith(("-prune", "-cleanup-crd", "-cleanup-gpucluster"))}, (jobs, seen)
        # The validator wrote every validation it makes, on each node (on the MIG node again
        # after the MIG manager restarted it with the new layout).
        for name in HARDWARE:
            written = ssh(node_lab.info(), name, "ls /run/nvidia/validations").stdout.split()
            assert {"driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready"} <= set(written), (name, written, seen)

        # The MIG node: the MIG manager applied the layout gpuboot's label names (the phase waited
        # for its state), gave the GPU clients back, and the kubelet allocates the MIG devices.
        mig_node = get("node", MIG_NODE, namespace=())[0]
        mig_labels = mig_node["metadata"]["labels"]
        assert (mig_labels.get("nvidia.com/mig.config"), mig_labels.get("nvidia.com/mig.config.state")) == \
            (MIG_LAYOUT, "success"), (mig_labels, seen)
        assert mig_node["status"]["allocatable"].get("nvidia.com/mig-1g.10gb") == str(GPUS * MIG_PER_GPU), seen
        assert mig_node["status"]["allocatable"].get("nvidia.com/gpu", "0") == "0", seen
        assert (mig_labels.get("nvidia.com/mig.capable"), mig_labels.get("nvidia.com/mig.strategy")) == ("true", "mixed"), seen
        assert {mig_labels.get(f"nvidia.com/gpu.deploy.{client}") for client in
                ("device-plugin", "gpu-feature-discovery", "dcgm-exporter")} == {"true"}, (mig_labels, seen)
        applied = json.loads(ssh(node_lab.info(), MIG_NODE, f"cat {gpu_operands.HARDWARE}").stdout)
        assert [len(gpu.get("mig", [])) for gpu in applied["gpus"]] == [MIG_PER_GPU] * GPUS, (applied, seen)

        # The phase run again (forced: a plain up skips it as converged) changes nothing: the
        # labels put back are gpuboot's for good, and no hook is applied again.
        again = run(["up", str(node_lab.inventory), "--from", "gpu_operator", "--to", "gpu_operator", "--force",
                     "--skip-mirror-check"])
        said = capsys.readouterr()
        (out / "up-again.txt").write_text(f"exit {again}\n{said.out}{said.err}")
        assert again == 0, ((said.out + said.err)[-4000:], seen)
        phases = json.loads((node_lab.kubeconfig.parent / "state.json").read_text())["phases"]
        assert phases["gpu_operator"]["changed"] == 0, (phases["gpu_operator"], seen)
