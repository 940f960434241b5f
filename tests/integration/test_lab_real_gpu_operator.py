"""NVIDIA's GPU Operator for real in a lab cluster (issue 29, point 3): its real chart from the
source tree at the tag the release pins, its controller and NFD built from their sources
(`gpuboot_lab.operators`), installed by gpuboot's gpu_operator phase through the air-gapped lab
mirror onto a kubeadm cluster whose GPU node declares its double hardware to the real NFD
through a local feature file. The operands' images are doubles.

First step: what the real operator deploys on the lab's GPU node and where each operand stops,
written to GPUBOOT_EXPERIMENT_OUT (or the test's tmp directory)."""
from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.mirror.bundle import Bundle
from gpuboot.mirror.plan import PlannedChart
from gpuboot.mirror.pull import chart_artifact
from gpuboot_lab import operators
from gpuboot_lab.cluster import LabSpec
from tests.integration.conftest import ssh
from tests.integration.test_double_schemas_vs_real_charts import source_tree
from tests.support.addon_doubles import NVIDIA_SMI, add_to_bundle
from tests.support.addon_lab import addon_lab

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NAME = "rgpu"
SUBNET = "10.213.88.0/24"
RELEASE = "k8s-1.36"
GPU_NODE = f"{NAME}-gpu1"
# NFD's local source: a feature file under features.d labels the node as if its PCI scan found
# an NVIDIA device (class 0302, vendor 10de), which is what the operator selects GPU nodes by.
FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/gpuboot-double-hardware"
DOUBLE_FEATURES = "pci-10de.present=true\npci-0302_10de.present=true\n"


def real_chart(helm: Path, release: matrix.Release, into: Path) -> tuple[str, bytes]:
    """(version, archive) of the GPU Operator's chart at the release's tag, packaged by the real helm."""
    version = release.gpu_operator["chart"]["version"]
    upstream, git_dir, tag = source_tree("gpu-operator", version, RELEASE)
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", tag, upstream.chart_dir],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    packaged = subprocess.run([str(helm), "package", str(into / upstream.chart_dir), "--version", version,
                               "--app-version", version, "--destination", str(into)],
                              capture_output=True, text=True)
    assert packaged.returncode == 0, packaged.stderr
    return version, next(into.glob("gpu-operator-*.tgz")).read_bytes()


def test_the_real_gpu_operator_deploys_its_operands_on_the_lab_s_gpu_node(lab_required, tmp_path, monkeypatch,
                                                                           capsys):
    release = matrix.load(RELEASE)
    out = Path(os.environ.get("GPUBOOT_EXPERIMENT_OUT", tmp_path / "experiment"))
    out.mkdir(parents=True, exist_ok=True)
    spec = LabSpec(name=NAME, control_planes=1, workers=0, gpu_workers=1, subnet=SUBNET, flavour="kubernetes",
                   release=RELEASE)
    with addon_lab(tmp_path, monkeypatch, capsys, spec) as node_lab:
        data = node_lab.settings()
        data["all"]["vars"]["gpu_operator_ready_timeout"] = 240
        node_lab.write(data)
        host_vars = node_lab.inventory.parent / "host_vars"
        host_vars.mkdir(exist_ok=True)
        (host_vars / f"{GPU_NODE}.yml").write_text(yaml.safe_dump({"gpuboot_node": {
            "os": "debian-12", "gpu": {"model": "H100-SXM5-80GB", "count": 2, "driver": "preinstalled"}}}))
        # Doubles first (every planned image and the chart), then the real chart and the real
        # controllers over them.
        add_to_bundle(node_lab.bundle, node_lab.inventory, node_lab.helm)
        bundle = Bundle(node_lab.bundle)
        name, artifacts = bundle.read_manifest()
        planned = next(a for a in artifacts if a.kind == "chart" and "gpu-operator" in a.ref)
        with tempfile.TemporaryDirectory() as tmp:
            version, archive = real_chart(node_lab.helm, release, Path(tmp))
        chart = chart_artifact(bundle, PlannedChart("gpu_operator", planned.ref.split("(")[-1].rstrip(")"),
                                                    "gpu-operator", version), archive)
        real = [chart, *operators.images(bundle, release, specs=tuple(
            s for s in operators.OPERATORS if s.component == "gpu_operator"))]
        replaced = {a.ref for a in real}
        bundle.write_manifest(name, [a for a in artifacts if a.ref not in replaced] + real)
        node_lab.start_mirror()
        ssh(node_lab.info(), GPU_NODE, f"mkdir -p {Path(FEATURES).parent} && printf '{DOUBLE_FEATURES}' > {FEATURES}")
        # The preinstalled driver is hardware: the node gets nvidia-smi's double, which the real
        # validator runs through chroot /host.
        ssh(node_lab.info(), GPU_NODE, "cat > /usr/bin/nvidia-smi && chmod 0755 /usr/bin/nvidia-smi",
            stdin=NVIDIA_SMI)

        code = run(["up", str(node_lab.inventory), "--to", "gpu_operator", "--skip-mirror-check"])
        said = capsys.readouterr()
        (out / "up.txt").write_text(f"exit {code}\n{said.out}\n{said.err}")
        kubectl = [str(node_lab.kubectl), "--kubeconfig", str(node_lab.kubeconfig), "--request-timeout=20s"]
        for label, args in {
            "nodes": ["get", "nodes", "-o", "yaml"],
            "clusterpolicy": ["get", "clusterpolicies.nvidia.com", "-o", "yaml"],
            "workloads": ["get", "ds,deploy,pods,jobs", "-A", "-o", "wide"],
            "describe": ["-n", "gpu-operator", "describe", "pods"],
            "events": ["get", "events", "-A", "--sort-by=.lastTimestamp"],
            "operator-log": ["-n", "gpu-operator", "logs", "deploy/gpu-operator", "--tail=400"],
        }.items():
            done = subprocess.run([*kubectl, *args], capture_output=True, text=True, timeout=60)
            (out / f"{label}.txt").write_text(done.stdout + done.stderr)
        pods = subprocess.run([*kubectl, "-n", "gpu-operator", "get", "pods", "-o", "name"], capture_output=True,
                              text=True, timeout=60).stdout.split()
        for pod in pods:
            done = subprocess.run([*kubectl, "-n", "gpu-operator", "logs", pod, "--all-containers", "--tail=100"],
                                  capture_output=True, text=True, timeout=60)
            (out / f"log-{pod.split('/')[-1]}.txt").write_text(done.stdout + done.stderr)
        assert pods, (out / "up.txt").read_text()[-4000:]
