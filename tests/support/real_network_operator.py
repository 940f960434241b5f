"""NVIDIA's real Network Operator in a kubernetes-flavour lab (tests/support/addon_lab.py): its
chart at the tag the release pins (tests/support/upstream_charts.py); its controller and the
chart's Node Feature Discovery built from source (`gpuboot_lab.operators`); a TEST DOUBLE only
where a ConnectX NIC is needed (tests/doubles/network_operator/operands): the RDMA shared device
plugin. On each fabric node, the hardware they look for: NFD's local feature file that says a
Mellanox PCI device is there, and the node's double sysfs tree where the plugin's double reads
it (the same tree preflight's discovery reads).

The lab's nodes run Debian, for which NVIDIA publishes no DOCA driver container (the operator
refuses the OS for one): its fabric nodes use the host's driver (network_operator.driver host),
so no driver container runs here; the container's path is held against the real operator on a
real API server (tests/integration/test_real_network_operator*.py, Ubuntu nodes)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from gpuboot import matrix
from gpuboot.mirror.bundle import Artifact, Bundle
from gpuboot_lab import operators
from tests.integration.conftest import ssh
from tests.support import go_doubles, upstream_charts
from tests.support.shell_images import shell_image

# NFD's local source: a feature file under features.d labels the node as if its PCI scan found
# a Mellanox device (vendor 15b3), which the operator places the DOCA driver and the RDMA
# shared device plugin by; NFD's own sources add the OS release and the kernel.
FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/gpuboot-double-nic"
DOUBLE_FEATURES = "pci-15b3.present=true\n"
# Where the operand doubles read the node's double hardware (the operands module's HardwareRoot
# is its sys/ folder): under /dev, which the RDMA shared device plugin's pod mounts.
HARDWARE_ROOT = "/dev/gpuboot-double"


def images(bundle: Bundle, release: matrix.Release) -> list[Artifact]:
    """The Network Operator's images for the lab: built from source where they can be, a double
    where a NIC is needed (the RDMA shared device plugin)."""
    operands = go_doubles.build("network_operator/operands", "network-operands").read_bytes()
    built = operators.images(bundle, release, specs=tuple(s for s in operators.OPERATORS
                                                          if s.component == "network_operator"))
    # The operator's DaemonSet runs it as /bin/k8s-rdma-shared-dp.
    rdma = shell_image(bundle, release.images["network_operator"]["rdmaSharedDevicePlugin"],
                       [("bin/k8s-rdma-shared-dp", operands, 0o755)], ["/bin/k8s-rdma-shared-dp"])
    return [*built, rdma]


def into_bundle(node_lab, release: matrix.Release) -> list[str]:
    """The bundle's Network Operator made real, with the NIC's doubles. Returns every planned image ref."""
    return upstream_charts.into_bundle(node_lab, release.name, "network_operator", "network-operator",
                                       release.network_operator["chart"]["version"],
                                       lambda bundle, _: images(bundle, release))


def declare_hardware(info: dict, trees: dict[str, Path]) -> None:
    """On each fabric node (name -> its double tree, as tests/doubles/hardware builds it): NFD's
    feature file and the tree where the plugin's double (and preflight, through its lab-only
    role inputs) read it."""
    for node, tree in trees.items():
        archive = subprocess.run(["tar", "-C", str(tree), "-c", "."], capture_output=True, check=True).stdout
        for command, stdin in ((f"mkdir -p {Path(FEATURES).parent} && printf '{DOUBLE_FEATURES}' > {FEATURES}", None),
                               (f"mkdir -p {HARDWARE_ROOT} && tar -x -C {HARDWARE_ROOT}", archive)):
            done = ssh(info, node, command, stdin=stdin)
            assert done.returncode == 0, f"{node}: {command}: {done.stderr}"


def keep(out: Path, info: dict) -> None:
    """What the cluster showed, for whoever reads a failure."""
    upstream_charts.keep(out, info, "nvidia-network-operator", {
        "nicclusterpolicy": ["get", "nicclusterpolicies.mellanox.com", "-o", "yaml"]}, tail=200)
