"""NVIDIA's real GPU Operator in a kubernetes-flavour lab (tests/support/addon_lab.py): its chart
at the tag the release pins, packaged by the real helm from the source tree on this machine,
and its images built from source with the hardware's TEST DOUBLES (tests/support/gpu_operands.py),
put into the lab's bundle over the doubles of every planned image; and, on each GPU node, the
hardware the operator and its operands look for: NFD's local feature file that says an NVIDIA
PCI device is there, and the preinstalled driver's double."""
from __future__ import annotations

from pathlib import Path

from gpuboot import matrix
from tests.integration.conftest import ssh
from tests.support import gpu_operands, upstream_charts

# NFD's local source: a feature file under features.d labels the node as if its PCI scan found
# an NVIDIA device (class 0302, vendor 10de), which is what the operator selects GPU nodes by.
FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/gpuboot-double-hardware"
DOUBLE_FEATURES = "pci-10de.present=true\npci-0302_10de.present=true\n"


def into_bundle(node_lab, release: matrix.Release) -> list[str]:
    """The bundle's GPU Operator made real (tests/support/upstream_charts.py), with the
    hardware's doubles. Returns every planned image ref."""
    return upstream_charts.into_bundle(node_lab, release.name, "gpu_operator", "gpu-operator",
                                       release.gpu_operator["chart"]["version"],
                                       lambda bundle, _: gpu_operands.images(bundle, release))


def declare_hardware(info: dict, hardware: dict[str, bytes]) -> None:
    """On each GPU node (name -> its double GPUs): NFD's feature file and the preinstalled
    driver's double, which the real validator runs through chroot /host."""
    for node, gpus in hardware.items():
        ssh(info, node, f"mkdir -p {Path(FEATURES).parent} && printf '{DOUBLE_FEATURES}' > {FEATURES}")
        for path, content, mode in gpu_operands.driver_files(gpus):
            ssh(info, node, f"mkdir -p {Path(path).parent} && cat > {path} && chmod {mode:o} {path}", stdin=content)


def keep(out: Path, info: dict) -> None:
    """What the cluster showed, for whoever reads a failure."""
    upstream_charts.keep(out, info, "gpu-operator", {
        "clusterpolicy": ["get", "clusterpolicies.nvidia.com", "-o", "yaml"],
        "operator-log": ["-n", "gpu-operator", "logs", "deploy/gpu-operator", "--tail=400"]})
