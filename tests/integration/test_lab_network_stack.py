"""The network stack in a real lab cluster (issue 14, point 5): one control plane, one HGX-like
worker (eight ConnectX-7 InfiniBand fabric ports, two ConnectX-6 Dx management ports in bond0)
and one worker without RDMA, kubernetes-flavour nodes air-gapped behind the lab mirror, the
Kubernetes built from Go modules and helm from its Go module.

TEST DOUBLES (tests/doubles/): the worker's hardware (a /sys tree that preflight's real
discovery module reads on the node, through the lab-only role input preflight_sys_root), the
Network Operator's chart (closed values schema that helm enforces, CRDs with the documented
fields, and the worker of its own NFD, which a cluster without GPU nodes runs), busybox images
under every planned name, and a controller that acts on the lab cluster from the applied
objects and the same hardware (NFD's labels where that worker runs, then, as the real operator
only on nodes so labelled, the component DaemonSets, VF and RDMA resources, SR-IOV node states,
Multus' network status). The nodes run Debian, for which NVIDIA publishes no DOCA driver
container: the inventory has the host's driver serve (network_operator.driver host), so no
driver container runs. Real: preflight over SSH on the node, helm template, the mirror, every
pull by containerd, the API server's validation and server-side apply, scheduling on the
advertised resources, and gpuboot's waits and gate. The real Network Operator in a lab cluster
is test_lab_network_operator.py's (RDMA shared ports); this module keeps the double for what
that one cannot run yet: VFs through the SR-IOV operator, and networks through Multus and nv-ipam."""
from __future__ import annotations

import json
import platform
import subprocess
import time

import pytest
import yaml

from gpuboot.cli.main import run
from gpuboot_lab.cluster import LabSpec, container_name
from tests.doubles.hardware.sysfs import build_tree, hgx_server
from tests.doubles.network_operator.operator import DoubleNetworkOperator
from tests.support.addon_doubles import add_to_bundle
from tests.support.addon_lab import addon_lab, kubectl, said
from tests.support.reuse import reuse_module

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NAME = "nstack"
SUBNET = "10.213.85.0/24"
RELEASE = "k8s-1.36"
HGX = f"{NAME}-w1"
DOUBLE_ROOT = "/srv/gpuboot-double"
FABRIC = [f"ens{i}f0np0" for i in range(1, 9)]
NICS = [
    {"name": "ib-fabric", "pf_names": FABRIC, "link_type": "ib", "mode": "both", "num_vfs": 4,
     "resource_name": "nvidia.com/ib_vf", "shared_resource_name": "nvidia.com/ib_shared",
     "network": {"name": "ib-fabric", "namespace": "training",
                 "ip_pool": {"subnet": "192.168.128.0/24", "per_node_block_size": 16}}},
    {"name": "mgmt", "pf_names": ["eno1np0", "eno2np0"], "purpose": "management"},
]
# Lab-only role inputs: discovery reads the double tree, whose bond0 carries the node's address.
HGX_VARS = {"preflight_sys_root": f"{DOUBLE_ROOT}/sys", "preflight_proc_root": f"{DOUBLE_ROOT}/proc",
            "preflight_address_interface": "bond0"}


@pytest.fixture(scope="module")
def reused(request):
    """The whole module is skipped as REUSED while nothing it depends on changed since it passed
    on this machine (tests/support/reuse.py; GPUBOOT_TESTS_FRESH=1 runs it)."""
    yield from reuse_module(request)


@pytest.fixture
def net_cluster(reused, lab_required, tmp_path, monkeypatch, capsys):
    spec = LabSpec(name=NAME, control_planes=1, workers=2, gpu_workers=0, subnet=SUBNET, flavour="kubernetes",
                   release=RELEASE)
    with addon_lab(tmp_path, monkeypatch, capsys, spec) as node_lab:
        data = node_lab.settings()
        # A broken component must be reported within the test's patience, not the product's 15 min.
        data["all"]["vars"]["network_operator_ready_timeout"] = 180
        # Debian has no DOCA driver container: the nodes' own driver serves (gpuboot demands it).
        data["all"]["vars"]["gpuboot"]["network_operator"] = {"driver": "host"}
        node_lab.write(data)
        # The HGX-like worker's hardware, on the node for preflight and here for the double operator.
        tree = tmp_path / "hgx"
        sys_root, _ = build_tree(hgx_server(gpus=0, nvswitches=0, connectx=8, link="ib", management=2, bond=True), tree)
        copied = subprocess.run(["podman", "cp", str(tree), f"{container_name(NAME, HGX)}:{DOUBLE_ROOT}"], capture_output=True, text=True)
        assert copied.returncode == 0, copied.stderr
        (node_lab.inventory.parent / "host_vars").mkdir()
        write_hgx(node_lab.inventory, NICS)
        images = add_to_bundle(node_lab.bundle, node_lab.inventory, node_lab.helm, components=("network_operator", "validate"))
        mirror = node_lab.start_mirror()
        hardware = {HGX: {"sys_root": sys_root, "os_tag": "debian12", "kernel": platform.release(), "arch": "amd64"}}
        with DoubleNetworkOperator(node_lab.kubectl, node_lab.kubeconfig, hardware) as operator:
            yield node_lab.info(images=images, operator=operator, mirror=mirror)


def eventually(check, seconds: float = 30) -> bool:
    """Whether check() holds within the seconds (the double reconciles every 2 s)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True


def write_hgx(inventory, nics) -> None:
    (inventory.parent / "host_vars" / f"{HGX}.yml").write_text(yaml.safe_dump(
        {"gpuboot_node": {"os": "debian-12", "nics": nics}, **HGX_VARS}))


def test_network_operator_from_the_mirror_and_the_hgx_node_advertises_what_the_inventory_asks(net_cluster,
                                                                                             capsys):
    info = net_cluster
    inventory = str(info["inventory"])
    # A group selected by vendor:device that the management ports share: preflight reads the
    # node's ports and refuses before anything is applied (the cluster is not even built).
    write_hgx(info["inventory"], NICS + [{"name": "roce", "device_ids": ["15b3:101d"], "resource_name": "rdma/roce"}])
    assert run(["up", inventory, "--to", "validate", "--skip-mirror-check"]) != 0
    refused = said(capsys)
    assert "NIC group roce's RDMA shared device plugin would take port eno1np0" in refused, refused
    assert "carries this node's own address (through bond0)" in refused, refused
    assert not info["kubeconfig"].exists()

    write_hgx(info["inventory"], NICS)
    assert run(["up", inventory, "--to", "validate", "--skip-mirror-check"]) == 0, said(capsys)
    capsys.readouterr()

    # The gate's report: the HGX node's resources, the policy, the VFs made, the network attached.
    report = json.loads((info["kubeconfig"].parent / "validate.json").read_text())
    assert report["short"] == 0, report
    rows = {(r["node"], r["check"]): r for r in report["rows"]}
    assert rows[(HGX, "fabric allocatable")]["got"] == "nvidia.com/ib_shared=63, nvidia.com/ib_vf=32"
    assert rows[(HGX, "VFs made")]["ok"] and rows[("-", "NicClusterPolicy")]["ok"]
    assert rows[(HGX, "attach training/ib-fabric")]["got"].startswith("192.168.128.")

    nodes = {n["metadata"]["name"]: n for n in json.loads(kubectl(info, "get", "nodes", "-o", "json"))["items"]}
    assert nodes[HGX]["status"]["allocatable"]["nvidia.com/ib_vf"] == "32"
    assert nodes[HGX]["metadata"]["labels"]["nic.gpuboot.io/ib-fabric"] == "true"
    plain = nodes[f"{NAME}-w2"]
    assert not any(k.startswith("nvidia.com/") for k in plain["status"]["allocatable"])
    assert "nic.gpuboot.io/fabric-node" not in plain["metadata"]["labels"]

    # The objects gpuboot applied, accepted by the API server against the CRDs.
    policy = json.loads(kubectl(info, "get", "nicclusterpolicies.mellanox.com", "nic-cluster-policy", "-o", "json"))
    assert policy["status"]["state"] == "ready"
    assert "ofedDriver" not in policy["spec"], policy["spec"]
    shared = json.loads(policy["spec"]["rdmaSharedDevicePlugin"]["config"])["configList"]
    assert shared[0]["selectors"] == {"vendors": ["15b3"], "ifNames": FABRIC, "linkTypes": ["infiniband"]}
    sriov = json.loads(kubectl(info, "get", "sriovnetworknodepolicies.sriovnetwork.openshift.io", "-n",
                               "nvidia-network-operator", "-o", "json"))["items"]
    assert [(p["metadata"]["name"], p["spec"]["numVfs"], p["spec"]["nicSelector"]["pfNames"]) for p in sriov] == [
        ("gpuboot-ib-fabric", 4, FABRIC)]
    pool = json.loads(kubectl(info, "get", "sriovnetworkpoolconfigs.sriovnetwork.openshift.io", "gpuboot-fabric", "-n",
                              "nvidia-network-operator", "-o", "json"))
    assert pool["spec"]["maxUnavailable"] == 1
    network = json.loads(kubectl(info, "get", "sriovibnetworks.sriovnetwork.openshift.io", "ib-fabric", "-n",
                                 "nvidia-network-operator", "-o", "json"))
    assert network["spec"]["networkNamespace"] == "training"
    # No Helm release: the objects were applied by gpuboot, as Argo CD will declare them.
    assert "helm.sh/release.v1" not in kubectl(info, "get", "secrets", "-n", "nvidia-network-operator", "-o", "yaml")

    # Every pod of the operator's namespace runs an image the mirror plan listed, pulled
    # through the mirror by containerd.
    pods = json.loads(kubectl(info, "get", "pods", "-n", "nvidia-network-operator", "-o", "json"))["items"]
    seen = set()
    for pod in pods:
        assert all(c["ready"] for c in pod["status"].get("containerStatuses", [])), pod["metadata"]["name"]
        for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            image = container["image"].removeprefix(info["mirror"] + "/")
            assert image in info["images"], image
            seen.add(image.split(":")[0].rsplit("/", 1)[1])
    # No GPU node here, so no GPU Operator: the chart's own NFD labelled the HGX node before the
    # operator (its double, as strict as the real one) would place the DOCA driver there.
    assert {"network-operator", "sriov-network-operator", "k8s-rdma-shared-dev-plugin", "multus-cni",
            "nvidia-k8s-ipam", "node-feature-discovery"} <= seen, seen
    assert "doca-driver" not in seen, seen
    assert nodes[HGX]["metadata"]["labels"]["feature.node.kubernetes.io/pci-15b3.present"] == "true"

    # A second run changes nothing; a deleted policy is put back.
    assert run(["up", inventory, "--from", "network_operator", "--to", "network_operator", "--force",
                "--skip-mirror-check"]) == 0, said(capsys)
    record = json.loads((info["kubeconfig"].parent / "state.json").read_text())["phases"]
    assert record["network_operator"]["changed"] == 0, record["network_operator"]
    kubectl(info, "-n", "nvidia-network-operator", "delete", "sriovnetworknodepolicies.sriovnetwork.openshift.io",
            "gpuboot-ib-fabric")
    assert run(["up", inventory, "--from", "network_operator", "--to", "network_operator", "--force",
                "--skip-mirror-check"]) == 0, said(capsys)
    kubectl(info, "-n", "nvidia-network-operator", "get", "sriovnetworknodepolicies.sriovnetwork.openshift.io",
            "gpuboot-ib-fabric")
