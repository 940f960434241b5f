"""NVIDIA's GPU Operator for real in a lab cluster: its real chart from the source tree at the
tag the release pins, its controller and NFD built from their sources (`gpuboot_lab.operators`),
installed by gpuboot's gpu_operator phase through the air-gapped lab mirror onto a kubeadm
cluster whose GPU node declares its double hardware to the real NFD through a local feature
file. Doubles stand only where a GPU is needed (tests/support/gpu_operands.py): the driver, the
container toolkit, the device plugin, GFD, the DCGM exporter and the validator's CUDA sample.

What it shows: the real operator, fed gpuboot's ClusterPolicy, deploys exactly the operands that
policy turns on, on the GPU node only, from exactly the images gpuboot's mirror plan holds; the
real validator passes the driver, toolkit, CUDA and device-plugin validations through the
doubles; the operator says Ready with reason Reconciled and gpuboot's phase is done; the GPUs
are allocatable from the kubelet and GFD's labels reach the node through the real NFD. What each
pod printed is kept in the test's tmp directory."""
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

# A control plane and a GPU worker, kubeadm's, in a subnet of their own.
SPEC = LabSpec(name="rgpu", control_planes=1, workers=0, gpu_workers=1, subnet="10.213.88.0/24", flavour="kubernetes",
               release="k8s-1.36")
GPU_NODE = f"{SPEC.name}-gpu1"
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
# The GPU node's double hardware: two L40S (no MIG: the MIG manager has no double yet).
GPUS = 2
DOUBLE_GPUS = gpu_operands.double_gpus("NVIDIA L40S", GPUS, family="ada-lovelace", mig_capable=False, memory_mib=46068)


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
        data["all"]["vars"]["gpuboot"]["gpu_operator"] = {"dev_char_symlinks": False}
        node_lab.write(data)
        host_vars = node_lab.inventory.parent / "host_vars"
        host_vars.mkdir(exist_ok=True)
        (host_vars / f"{GPU_NODE}.yml").write_text(yaml.safe_dump({"gpuboot_node": {
            "os": "debian-12", "gpu": {"model": "L40S-48GB", "count": GPUS, "driver": "preinstalled"}}}))
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
        ssh(node_lab.info(), GPU_NODE, f"mkdir -p {Path(FEATURES).parent} && printf '{DOUBLE_FEATURES}' > {FEATURES}")
        # The preinstalled driver is hardware: its double, which the real validator runs through chroot /host.
        for path, content, mode in gpu_operands.driver_files(DOUBLE_GPUS):
            ssh(node_lab.info(), GPU_NODE, f"mkdir -p {Path(path).parent} && cat > {path} && chmod {mode:o} {path}",
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
        # Every operand pod on the GPU node and nowhere else (NFD's worker runs on every node).
        operand_pods = [p for p in pods if any(r["kind"] == "DaemonSet" and r["name"] in wanted
                                               for r in p["metadata"].get("ownerReferences", []))]
        assert {r["name"] for p in operand_pods for r in p["metadata"]["ownerReferences"]} == wanted, seen
        assert {p["spec"].get("nodeName") for p in operand_pods} == {GPU_NODE}, seen

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
        # The validator wrote every validation it makes, on the node.
        written = ssh(node_lab.info(), GPU_NODE, "ls /run/nvidia/validations").stdout.split()
        assert {"driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready"} <= set(written), (written, seen)

        # The phase run again (forced: a plain up skips it as converged) changes nothing: the
        # labels put back are gpuboot's for good, and no hook is applied again.
        again = run(["up", str(node_lab.inventory), "--from", "gpu_operator", "--to", "gpu_operator", "--force",
                     "--skip-mirror-check"])
        said = capsys.readouterr()
        (out / "up-again.txt").write_text(f"exit {again}\n{said.out}{said.err}")
        assert again == 0, ((said.out + said.err)[-4000:], seen)
        phases = json.loads((node_lab.kubeconfig.parent / "state.json").read_text())["phases"]
        assert phases["gpu_operator"]["changed"] == 0, (phases["gpu_operator"], seen)
