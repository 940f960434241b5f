"""NVIDIA's real Network Operator in a kubernetes-flavour lab (tests/support/addon_lab.py): its
chart at the tag the release pins (tests/support/upstream_charts.py); its controller and the
chart's Node Feature Discovery built from source (`gpuboot_lab.operators`); the SR-IOV
operator (NVIDIA's fork), the CNI plugins its config daemon copies onto the nodes, and the
secondary networks' Multus, nv-ipam and container networking plugins are built from source
too. TEST DOUBLES only where a ConnectX NIC is needed
(tests/doubles/network_operator/operands): the RDMA shared device plugin, the SR-IOV config
daemon (it makes VFs in the node's double tree) and the SR-IOV device plugin. On each fabric
node, the hardware they look for: NFD's local feature file that says a Mellanox PCI device is
there, and the node's double sysfs tree where the doubles read it (the same tree preflight's
discovery reads), bound also where the SR-IOV device plugin's pod can see it; and for a port a
network's CNI plugin uses as its master (macvlan), a link of the port's name in the node's
network namespace (one end of a veth pair), standing for the port's netdev.

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
# is its sys/ folder): under /dev, which the RDMA shared device plugin's pod mounts (the config
# daemon's pod mounts the host's / at /host).
HARDWARE_ROOT = "/dev/gpuboot-double"
# The SR-IOV device plugin's pod mounts no host folder but the kubelet's and the device-info
# folder: the tree is bound there too (the double's sriovDPHardwareRoot).
DEVICE_INFO_ROOT = "/var/run/k8s.cni.cncf.io/devinfo/dp/gpuboot-double"
# The config daemon's preStop hook: the real script undoes the OVS hardware offload the real
# daemon set up on the host; the double sets up none.
CLEAN_SERVICES = (b"#!/bin/sh\n# TEST DOUBLE of the SR-IOV config daemon's clean-k8s-services.sh: the double "
                  b"sets up no host service to undo.\nexit 0\n")


def images(bundle: Bundle, release: matrix.Release) -> list[Artifact]:
    """The Network Operator's images for the lab: built from source where they can be, a double
    where a NIC is needed (the RDMA shared device plugin, the SR-IOV config daemon and device
    plugin)."""
    operands = go_doubles.build("network_operator/operands", "network-operands").read_bytes()
    specs = (*(s for s in operators.OPERATORS if s.component == "network_operator"), operators.SRIOV_OPERATOR,
             *operators.SRIOV_CNIS, *operators.SECONDARY_NETWORKS)
    built = operators.images(bundle, release, specs=specs)
    refs = release.images["network_operator"]
    # The operator's DaemonSet runs it as /bin/k8s-rdma-shared-dp.
    rdma = shell_image(bundle, refs["rdmaSharedDevicePlugin"], [("bin/k8s-rdma-shared-dp", operands, 0o755)],
                       ["/bin/k8s-rdma-shared-dp"])
    # The SR-IOV operator's DaemonSets run `sriov-network-config-daemon start` (and `wait-for-config`
    # in the device plugin's init container) and the device plugin image with its arguments only.
    daemon = shell_image(bundle, refs["sriovConfigDaemon"], [
        ("usr/bin/sriov-network-config-daemon", operands, 0o755),
        ("bindata/scripts/clean-k8s-services.sh", CLEAN_SERVICES, 0o755)], ["/usr/bin/sriov-network-config-daemon"])
    plugin = shell_image(bundle, refs["sriovDevicePlugin"], [("usr/bin/sriovdp", operands, 0o755)], ["/usr/bin/sriovdp"])
    return [*built, rdma, daemon, plugin]


def into_bundle(node_lab, release: matrix.Release) -> list[str]:
    """The bundle's Network Operator made real, with the NIC's doubles. Returns every planned image ref."""
    return upstream_charts.into_bundle(node_lab, release.name, "network_operator", "network-operator",
                                       release.network_operator["chart"]["version"],
                                       lambda bundle, _: images(bundle, release))


def declare_hardware(info: dict, trees: dict[str, Path], netdevs: dict[str, list[str]] | None = None) -> None:
    """On each fabric node (name -> its double tree, as tests/doubles/hardware builds it): NFD's
    feature file and the tree where the plugin's double (and preflight, through its lab-only
    role inputs) read it; `netdevs`: per node, the ports that need a netdev."""
    for node, tree in trees.items():
        archive = subprocess.run(["tar", "-C", str(tree), "-c", "."], capture_output=True, check=True).stdout
        # A veth pair (the lab's kernel has no dummy links): the port's end takes a macvlan.
        links = [f"ip link add {name} type veth peer name {name}-p && ip link set {name}-p up && ip link set {name} up"
                 for name in (netdevs or {}).get(node, [])]
        for command, stdin in ((f"mkdir -p {Path(FEATURES).parent} && printf '{DOUBLE_FEATURES}' > {FEATURES}", None),
                               (f"mkdir -p {HARDWARE_ROOT} && tar -x -C {HARDWARE_ROOT}", archive),
                               (f"mkdir -p {DEVICE_INFO_ROOT} && mount --bind {HARDWARE_ROOT} {DEVICE_INFO_ROOT}", None),
                               *((link, None) for link in links)):
            done = ssh(info, node, command, stdin=stdin)
            assert done.returncode == 0, f"{node}: {command}: {done.stderr}"


def keep(out: Path, info: dict) -> None:
    """What the cluster showed, for whoever reads a failure."""
    upstream_charts.keep(out, info, "nvidia-network-operator", {
        "nicclusterpolicy": ["get", "nicclusterpolicies.mellanox.com", "-o", "yaml"],
        "ippools": ["get", "ippools.nv-ipam.nvidia.com", "-A", "-o", "yaml"],
        "network-attachment-definitions": ["get", "network-attachment-definitions", "-A", "-o", "yaml"]}, tail=200)
