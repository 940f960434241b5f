"""NVIDIA's real Network Operator in a real lab cluster (issue 29, points 3 and 4): one control
plane, one HGX-like worker (eight ConnectX-7 fabric ports: four RoCE ports handed to pods by the
RDMA shared device plugin, one of them a group of its own with a macvlan network over it; four
InfiniBand ports cut into VFs
by the SR-IOV operator; two ConnectX-6 Dx management ports in bond0) and one worker without
RDMA, kubernetes-flavour nodes air-gapped behind the lab mirror, the Kubernetes built from Go
modules and helm from its Go module. The Network Operator's real chart at the tag the release
pins, packaged by the real helm from the source tree; its controller and the chart's Node
Feature Discovery (no GPU node here, so the chart's), NVIDIA's SR-IOV operator, the CNI plugins
its config daemon copies onto the node, and Multus, nv-ipam and the container networking
plugins the NicClusterPolicy deploys for the network, built from their sources
(`gpuboot_lab.operators`); installed by gpuboot's network_operator phase. The nodes run Debian,
for which NVIDIA publishes no DOCA driver container: the inventory says the host's driver
serves (network_operator.driver host), as gpuboot demands there.

TEST DOUBLES only where a ConnectX NIC is needed (tests/support/real_network_operator.py): the
worker's hardware (a sysfs tree that preflight's real discovery reads, and the plugin's double
too, and a veth link standing for the netdev of the port the macvlan network uses), declared
to the real NFD through a local feature file; the RDMA shared device plugin, the SR-IOV config
daemon and the SR-IOV device plugin (tests/doubles/network_operator/operands: the real ones'
config rules and selectors, the config daemon's node-state report and drain handshake with the
real operator, VFs made in the node's tree, registration with the real kubelet). A pod on a VF
network would need a VF to move into it: the VF group has no network here (the SriovIBNetwork's
attachment is shown against the real SR-IOV operator in test_real_sriov_operator.py).

What it shows: preflight refuses a group whose selector takes the management ports before
anything is built; the real operator, fed gpuboot's NicClusterPolicy, runs no driver container,
lifts its driver wait on the node NFD labelled as holding a Mellanox NIC, places the RDMA shared
device plugin there only and says the policy is ready; the real SR-IOV operator, fed gpuboot's
policy, asks the HGX node's config daemon for the VF group's ports and VF count and runs the
SR-IOV device plugin there only; the real operator turns gpuboot's MacvlanNetwork into a
NetworkAttachmentDefinition, nv-ipam gives the HGX node a block of the pool, and validate's pod
attached to the network through the real Multus, macvlan and nv-ipam gets an address of that
block; the phase's wait and the gate pass on it; the kubelet advertises the shared ports and the
VFs as the inventory asks; every pod's image is one gpuboot's mirror plan holds and every
planned image of what the operator deploys is deployed; a second run changes nothing, and puts
back a deleted policy."""
from __future__ import annotations

import json

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.mirror import plan as mirror_plan
from gpuboot_lab.cluster import LabSpec
from tests.doubles.hardware.sysfs import ARPHRD, build_tree, hgx_server
from tests.support import real_network_operator
from tests.support.addon_lab import addon_lab, kubectl, phase_changes, said
from tests.support.reuse import reuse_module

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NAME = "nreal"
SUBNET = "10.213.88.0/24"
RELEASE = "k8s-1.36"
HGX, PLAIN = f"{NAME}-w1", f"{NAME}-w2"
NAMESPACE = "nvidia-network-operator"
# The SR-IOV operator subchart's Deployment, which its template leaves without a namespace.
SRIOV_OPERATOR = "network-operator-sriov-network-operator"
SHARED_PORTS = [f"ens{i}f0np0" for i in range(1, 5)]
VF_PORTS = [f"ens{i}f0np0" for i in range(5, 9)]
SHARED = "nvidia.com/roce_shared"
STORAGE = "nvidia.com/roce_storage"
VFS = "nvidia.com/ib_vf"
RDMA_HCA_MAX = 63
NUM_VFS = 4
# The macvlan network on a shared RoCE port of its own (a macvlan has one parent interface).
NETWORK, NETWORK_NAMESPACE, SUBNET_PREFIX = "storage", "training", "192.168.130."
NICS = [
    {"name": "roce-storage", "pf_names": SHARED_PORTS[:1], "link_type": "eth", "resource_name": STORAGE,
     "network": {"name": NETWORK, "namespace": NETWORK_NAMESPACE,
                 "ip_pool": {"subnet": f"{SUBNET_PREFIX}0/24", "per_node_block_size": 16}}},
    {"name": "roce-shared", "pf_names": SHARED_PORTS[1:], "link_type": "eth", "resource_name": SHARED},
    {"name": "ib-vf", "pf_names": VF_PORTS, "link_type": "ib", "num_vfs": NUM_VFS, "resource_name": VFS},
    {"name": "mgmt", "pf_names": ["eno1np0", "eno2np0"], "purpose": "management"},
]
# Lab-only role inputs: discovery reads the double tree, whose bond0 carries the node's address.
HGX_VARS = {"preflight_sys_root": f"{real_network_operator.HARDWARE_ROOT}/sys",
            "preflight_proc_root": f"{real_network_operator.HARDWARE_ROOT}/proc",
            "preflight_address_interface": "bond0"}
MOFED_WAIT = "network.nvidia.com/operator.mofed.wait"
# Planned for gpuboot itself, not for the operator: the RDMA bandwidth test a person runs.
GPUBOOT_OWN = ("bandwidthTest",)


@pytest.fixture(scope="module")
def reused(request):
    """The whole module is skipped as REUSED while nothing it depends on changed since it passed
    on this machine (tests/support/reuse.py; GPUBOOT_TESTS_FRESH=1 runs it)."""
    yield from reuse_module(request)


@pytest.fixture
def net_cluster(reused, lab_required, tmp_path, monkeypatch, capsys):
    release = matrix.load(RELEASE)
    spec = LabSpec(name=NAME, control_planes=1, workers=2, gpu_workers=0, subnet=SUBNET, flavour="kubernetes",
                   release=RELEASE)
    with addon_lab(tmp_path, monkeypatch, capsys, spec) as node_lab:
        data = node_lab.settings()
        data["all"]["vars"]["gpuboot"]["network_operator"] = {"driver": "host"}
        node_lab.write(data)
        (node_lab.inventory.parent / "host_vars").mkdir()
        write_hgx(node_lab.inventory, NICS)
        tree = tmp_path / "hgx"
        build_tree(hgx_with_two_fabrics(), tree)
        images = real_network_operator.into_bundle(node_lab, release)
        mirror = node_lab.start_mirror()
        info = node_lab.info(images=images, mirror=mirror, release=release, out=tmp_path / "seen")
        real_network_operator.declare_hardware(info, {HGX: tree}, netdevs={HGX: SHARED_PORTS[:1]})
        try:
            yield info
        finally:
            real_network_operator.keep(info["out"], info)


def hgx_with_two_fabrics() -> dict:
    """The HGX-like worker's hardware: RoCE on the shared ports, InfiniBand on the VF ports."""
    facts = hgx_server(gpus=0, nvswitches=0, connectx=8, link="eth", management=2, bond=True)
    for port in VF_PORTS:
        facts["net"][port]["type"] = ARPHRD["ib"]
        facts["pci"][facts["net"][port]["device"]]["class"] = "0x020700\n"
    return facts


def write_hgx(inventory, nics: list[dict]) -> None:
    (inventory.parent / "host_vars" / f"{HGX}.yml").write_text(yaml.safe_dump(
        {"gpuboot_node": {"os": "debian-12", "nics": nics}, **HGX_VARS}))


def get(info, *args: str, namespace: tuple[str, ...] = ("-n", NAMESPACE)) -> list[dict]:
    found = json.loads(kubectl(info, *namespace, "get", *args, "-o", "json"))
    return found.get("items", [found])


def test_the_real_network_operator_installs_from_the_mirror_and_the_hgx_node_advertises_its_shared_ports(
        net_cluster, capsys):
    info = net_cluster
    seen = f"(what the cluster showed: {info['out']}, kept at the test's end)"
    # A group selected by vendor:device that the management ports share: preflight reads the
    # node's ports and refuses before anything is applied (the cluster is not even built).
    write_hgx(info["inventory"], NICS + [{"name": "roce", "device_ids": ["15b3:101d"], "resource_name": "rdma/roce"}])
    assert run(["up", str(info["inventory"]), "--to", "validate", "--skip-mirror-check"]) != 0
    refused = said(capsys)
    assert "NIC group roce's RDMA shared device plugin would take port eno1np0" in refused, refused
    assert "carries this node's own address (through bond0)" in refused, refused
    assert not info["kubeconfig"].exists()

    write_hgx(info["inventory"], NICS)
    code = run(["up", str(info["inventory"]), "--to", "validate", "--skip-mirror-check"])
    told = said(capsys)
    assert code == 0, (told, seen)

    # The gate's report: the HGX node's shared resource and the policy.
    report = json.loads((info["kubeconfig"].parent / "validate.json").read_text())
    assert report["short"] == 0, report
    rows = {(r["node"], r["check"]): r for r in report["rows"]}
    advertised = dict(item.split("=") for item in rows[(HGX, "fabric allocatable")]["got"].split(", "))
    assert advertised == {SHARED: str(RDMA_HCA_MAX), STORAGE: str(RDMA_HCA_MAX), VFS: str(NUM_VFS * len(VF_PORTS))}, \
        rows[(HGX, "fabric allocatable")]
    assert rows[("-", "NicClusterPolicy")]["ok"] and rows[(HGX, "VFs made")]["got"] == "Succeeded", rows
    # validate's pod on the network, attached by the real Multus through the real macvlan plugin
    # over the port's netdev, its address from the real nv-ipam.
    attached = rows[(HGX, f"attach {NETWORK_NAMESPACE}/{NETWORK}")]
    assert attached["ok"] and attached["got"].startswith(SUBNET_PREFIX), attached

    # The kubelet advertises what the RDMA shared device plugin (its double, through the
    # device-plugin API) registered, on the HGX node only.
    nodes = {n["metadata"]["name"]: n for n in get(info, "nodes", namespace=())}
    assert nodes[HGX]["status"]["allocatable"].get(SHARED) == str(RDMA_HCA_MAX), seen
    assert nodes[HGX]["status"]["allocatable"].get(STORAGE) == str(RDMA_HCA_MAX), seen
    assert nodes[HGX]["status"]["allocatable"].get(VFS) == str(NUM_VFS * len(VF_PORTS)), seen
    assert not any(k.startswith("nvidia.com/") for k in nodes[PLAIN]["status"]["allocatable"]), seen
    # The real NFD labelled the HGX node from its feature file and its own sources (the OS, the
    # kernel), and the operator, with no driver container to wait for, lifted its wait there.
    labels = nodes[HGX]["metadata"]["labels"]
    assert labels.get("feature.node.kubernetes.io/pci-15b3.present") == "true", (labels, seen)
    assert labels.get("feature.node.kubernetes.io/system-os_release.ID") == "debian", (labels, seen)
    assert labels.get("feature.node.kubernetes.io/kernel-version.full"), (labels, seen)
    assert labels.get(MOFED_WAIT) == "false", (labels, seen)
    assert "feature.node.kubernetes.io/pci-15b3.present" not in nodes[PLAIN]["metadata"]["labels"], seen

    # The policy the real operator reconciled: ready, no driver container anywhere, the RDMA
    # shared device plugin on the HGX node only.
    policy = get(info, "nicclusterpolicies.mellanox.com", "nic-cluster-policy", namespace=())[0]
    assert policy["status"]["state"] == "ready", (policy["status"], seen)
    pods = get(info, "pods")
    on: dict[str, set[str]] = {}
    for pod in pods:
        for container in pod["spec"]["containers"]:
            on.setdefault(container["name"], set()).add(pod["spec"].get("nodeName"))
    assert "mofed-container" not in on and "ofedDriver" not in policy["spec"], (on, seen)
    assert on.get("rdma-shared-dp") == {HGX}, (on, seen)
    assert on.get("sriov-network-config-daemon") == {HGX} and on.get("sriov-device-plugin") == {HGX}, (on, seen)
    assert HGX in on.get("kube-multus", set()) and HGX in on.get("nv-ipam-node", set()), (on, seen)
    assert HGX in on.get("cni-plugins", set()) and on.get("nv-ipam-controller"), (on, seen)
    # The real operator made the network's attachment from gpuboot's MacvlanNetwork, and nv-ipam's
    # controller gave the HGX node a block of the pool; the attached address is in it.
    attachment = get(info, "network-attachment-definitions.k8s.cni.cncf.io", NETWORK,
                     namespace=("-n", NETWORK_NAMESPACE))[0]
    config = json.loads(attachment["spec"]["config"])
    assert (config.get("type"), config.get("master"), config.get("mode")) == ("macvlan", SHARED_PORTS[0], "bridge"), \
        (config, seen)
    assert config["ipam"] == {"type": "nv-ipam", "poolName": "gpuboot-roce-storage"}, (config, seen)
    pool = get(info, "ippools.nv-ipam.nvidia.com", "gpuboot-roce-storage")[0]
    blocks = {a["nodeName"]: a for a in pool.get("status", {}).get("allocations", [])}
    assert set(blocks) == {HGX}, (pool.get("status"), seen)
    start = blocks[HGX]["startIP"].rsplit(".", 1)[1]
    end = blocks[HGX]["endIP"].rsplit(".", 1)[1]
    assert int(start) <= int(attached["got"].split("/")[0].rsplit(".", 1)[1]) <= int(end), (blocks, attached)
    # The real SR-IOV operator asked the HGX node for the VF group's ports only, and its config
    # daemon (the double) made them and says so.
    state = get(info, "sriovnetworknodestates.sriovnetwork.openshift.io", HGX)[0]
    asked = {i.get("name"): i.get("numVfs") for i in state["spec"].get("interfaces", [])}
    assert asked == dict.fromkeys(VF_PORTS, NUM_VFS), (asked, seen)
    assert state["status"].get("syncStatus") == "Succeeded", (state["status"], seen)

    # What the operator and the chart deployed is what gpuboot's mirror plan holds for them, and
    # every pod's image was pulled through the mirror (init containers too).
    release = info["release"]
    plan = mirror_plan.build(release, mirror_plan.Target.of(load_cluster(info["inventory"]), release)).only(
        {"network_operator"})
    own = {release.images["network_operator"][key] for key in GPUBOOT_OWN}
    mirror = f"{info['mirror']}/"
    running = {c["image"].removeprefix(mirror) for pod in pods
               for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])}
    planned = {str(image.ref) for image in plan.images} - own
    assert running == planned, (sorted(running - planned), sorted(planned - running), seen)
    for pod in pods:
        if pod["status"].get("phase") == "Running":
            assert all(c["ready"] for c in pod["status"]["containerStatuses"]), (pod["metadata"]["name"], seen)

    # The SR-IOV operator's subchart names no namespace on its Deployment and ConfigMap: the
    # phase put them in the release's namespace, as Argo CD does, and nothing of the chart in
    # `default`.
    assert get(info, "deployment", SRIOV_OPERATOR)[0]["status"].get("readyReplicas") == 1, seen
    assert kubectl(info, "-n", "default", "get", "--ignore-not-found", "-o", "name", f"deployment/{SRIOV_OPERATOR}",
                   "configmap/supported-nic-ids", "serviceaccount/network-operator-hooks-sa") == "", seen

    # A second run (forced: a plain up skips the phase as converged) changes nothing.
    assert run(["up", str(info["inventory"]), "--from", "network_operator", "--to", "network_operator", "--force",
                "--skip-mirror-check"]) == 0, said(capsys)
    assert phase_changes(info)["network_operator"] == 0, seen

    # What an earlier gpuboot's `kubectl apply -f` put in `default` (the Deployment, by gpuboot's
    # field manager) goes on the next run; an object of a chart's name that someone else made
    # there stays.
    def planted(kind: str, name: str, manager: str) -> None:
        body = {"apiVersion": "v1" if kind == "ConfigMap" else "apps/v1", "kind": kind,
                "metadata": {"name": name, "namespace": "default"}}
        if kind == "Deployment":
            labels = {"name": "planted"}
            body["spec"] = {"replicas": 0, "selector": {"matchLabels": labels},
                            "template": {"metadata": {"labels": labels},
                                         "spec": {"containers": [{"name": "c", "image": "planted"}]}}}
        kubectl(info, "apply", "--server-side", f"--field-manager={manager}", "-f", "-", stdin=json.dumps(body))

    planted("Deployment", SRIOV_OPERATOR, "gpuboot")
    planted("ConfigMap", "supported-nic-ids", "someone-else")
    # And a policy deleted by hand is put back.
    kubectl(info, "-n", NAMESPACE, "delete", "sriovnetworknodepolicies.sriovnetwork.openshift.io", "gpuboot-ib-vf")
    assert run(["up", str(info["inventory"]), "--from", "network_operator", "--to", "network_operator", "--force",
                "--skip-mirror-check"]) == 0, said(capsys)
    left = {f"{o['kind']}/{o['metadata']['name']}" for o in get(info, "deployments,configmaps", namespace=("-n", "default"))}
    assert f"Deployment/{SRIOV_OPERATOR}" not in left and "ConfigMap/supported-nic-ids" in left, (left, seen)
    assert get(info, "sriovnetworknodepolicies.sriovnetwork.openshift.io", "gpuboot-ib-vf")[0]["spec"]["numVfs"] == NUM_VFS
    assert phase_changes(info)["network_operator"] == 2, seen
