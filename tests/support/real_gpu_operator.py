"""NVIDIA's real GPU Operator in a kubernetes-flavour lab (tests/support/addon_lab.py): its chart
at the tag the release pins, packaged by the real helm from the source tree on this machine,
and its images built from source with the hardware's TEST DOUBLES (tests/support/gpu_operands.py),
put into the lab's bundle over the doubles of every planned image; and, on each GPU node, the
hardware the operator and its operands look for: NFD's local feature file that says an NVIDIA
PCI device is there, and the preinstalled driver's double."""
from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

from gpuboot import matrix
from gpuboot.mirror.bundle import Bundle
from gpuboot.mirror.plan import PlannedChart
from gpuboot.mirror.pull import chart_artifact
from tests.integration.conftest import ssh
from tests.integration.test_double_schemas_vs_real_charts import source_tree
from tests.support import gpu_operands
from tests.support.addon_doubles import add_to_bundle

# NFD's local source: a feature file under features.d labels the node as if its PCI scan found
# an NVIDIA device (class 0302, vendor 10de), which is what the operator selects GPU nodes by.
FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/gpuboot-double-hardware"
DOUBLE_FEATURES = "pci-10de.present=true\npci-0302_10de.present=true\n"


def real_chart(helm: Path, release: matrix.Release, into: Path) -> tuple[str, bytes]:
    """(version, archive) of the GPU Operator's chart at the release's tag, packaged by the real helm."""
    version = release.gpu_operator["chart"]["version"]
    upstream, git_dir, tag = source_tree("gpu-operator", version, release.name)
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", tag, upstream.chart_dir],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    packaged = subprocess.run([str(helm), "package", str(into / upstream.chart_dir), "--version", version,
                               "--app-version", version, "--destination", str(into)],
                              capture_output=True, text=True)
    assert packaged.returncode == 0, packaged.stderr
    return version, next(into.glob("gpu-operator-*.tgz")).read_bytes()


def into_bundle(node_lab, release: matrix.Release) -> list[str]:
    """The bundle's GPU Operator made real: doubles first (every planned image and the chart of
    the GPU Operator and validate), then the real chart and the images built from source, with
    the hardware's doubles, over them. Returns every planned image ref."""
    images = add_to_bundle(node_lab.bundle, node_lab.inventory, node_lab.helm)
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
    return images


def declare_hardware(info: dict, hardware: dict[str, bytes]) -> None:
    """On each GPU node (name -> its double GPUs): NFD's feature file and the preinstalled
    driver's double, which the real validator runs through chroot /host."""
    for node, gpus in hardware.items():
        ssh(info, node, f"mkdir -p {Path(FEATURES).parent} && printf '{DOUBLE_FEATURES}' > {FEATURES}")
        for path, content, mode in gpu_operands.driver_files(gpus):
            ssh(info, node, f"mkdir -p {Path(path).parent} && cat > {path} && chmod {mode:o} {path}", stdin=content)


def keep(out: Path, info: dict) -> None:
    """What the cluster showed, for whoever reads a failure."""
    base = [str(info["kubectl"]), "--kubeconfig", str(info["kubeconfig"]), "--request-timeout=20s"]
    for label, args in {
        "clusterpolicy": ["get", "clusterpolicies.nvidia.com", "-o", "yaml"],
        "nodes": ["get", "nodes", "-o", "yaml"],
        "workloads": ["get", "ds,deploy,pods,jobs", "-A", "-o", "wide"],
        "events": ["get", "events", "-A", "--sort-by=.lastTimestamp"],
        "operator-log": ["-n", "gpu-operator", "logs", "deploy/gpu-operator", "--tail=400"],
    }.items():
        done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)
        (out / f"{label}.txt").write_text(done.stdout + done.stderr)
    names = subprocess.run([*base, "-n", "gpu-operator", "get", "pods", "-o", "name"], capture_output=True,
                           text=True, timeout=60).stdout.split()
    for pod in names:
        done = subprocess.run([*base, "-n", "gpu-operator", "logs", pod, "--all-containers", "--tail=100"],
                              capture_output=True, text=True, timeout=60)
        (out / f"log-{pod.split('/')[-1]}.txt").write_text(done.stdout + done.stderr)
