"""What the Network Operator does with each node's NICs: NIC groups across nodes, the SR-IOV
policies and RDMA shared device plugin entries they become, the secondary networks and the
resources each node must advertise; and every misfit located, before a host is touched.
Inventories are written as operators write them: INI, host ranges, group_vars."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuboot import matrix
from gpuboot.config.loader import load_cluster
from gpuboot.errors import InventoryError
from gpuboot.mirror import plan as mirror_plan

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "tests" / "fixtures" / "mixed-fleet" / "hosts.ini"


def test_mixed_fleet_resolves_one_object_per_nic_group():
    plan = load_cluster(FLEET).nic_plan.as_data()
    assert plan["enabled"] and plan["sriov"] and plan["rdma_shared"]
    # NVMe over RDMA rides a ConnectX port on the HGX nodes: the DOCA driver must unload it first.
    assert plan["unload_storage_modules"] is True
    policies = {p["name"]: p for p in plan["sriov_policies"]}
    assert set(policies) == {"gpuboot-ib-fabric", "gpuboot-roce"}
    ib = policies["gpuboot-ib-fabric"]
    assert ib["linkType"] == "ib" and ib["numVfs"] == 4 and ib["isRdma"] and ib["resourceName"] == "ib_vf"
    assert ib["nicSelector"] == {"vendor": "15b3", "pfNames": ["ibp24s0", "ibp41s0", "ibp64s0", "ibp79s0",
                                                              "ibp148s0", "ibp165s0", "ibp193s0", "ibp209s0"]}
    assert policies["gpuboot-roce"]["nicSelector"] == {"vendor": "15b3", "deviceID": "1021"}
    # Only the RoCE group is shared; its entry selects exactly its device id and link type.
    assert plan["shared_config"]["configList"] == [{
        "resourceName": "roce_shared", "resourcePrefix": "nvidia.com", "rdmaHcaMax": 32,
        "selectors": {"vendors": ["15b3"], "deviceIDs": ["1021"], "linkTypes": ["ether"]}}]
    networks = {n["name"]: n for n in plan["networks"]}
    assert networks["ib-fabric"]["kind"] == "SriovIBNetwork" and networks["ib-fabric"]["namespace"] == "training"
    assert networks["roce"]["kind"] == "SriovNetwork" and networks["roce"]["gateway"] == "192.168.160.1"
    # Labels: the groups' policies and pools pick their nodes, the NicClusterPolicy every fabric node.
    labels = plan["node_labels"]
    assert set(labels) == {"hgx01", "hgx02", "hgx03", "hgx04", "l40s01", "l40s02"}
    assert labels["hgx01"] == {"nic.gpuboot.io/fabric-node": "true", "nic.gpuboot.io/ib-fabric": "true"}
    assert labels["l40s02"] == {"nic.gpuboot.io/fabric-node": "true", "nic.gpuboot.io/roce": "true"}
    # What each node must advertise: 8 PFs x 4 VFs; by device id the VF count is known only
    # once preflight has counted the ports.
    assert plan["nodes"]["hgx03"]["resources"] == {"nvidia.com/ib_vf": 32}
    assert plan["nodes"]["l40s01"]["resources"] == {"nvidia.com/roce_vf": None, "nvidia.com/roce_shared": 32}
    assert "h100pcie01" not in plan["nodes"] and "cpu01" not in plan["nodes"]
    # What acts on each node's ports, for preflight to check against the real ones: the shared
    # plugin runs on every fabric node (the HGX's ConnectX-7 IB ports share the RoCE ports'
    # device id, so its entry's link type is what keeps them out).
    assert [r["group"] for r in plan["nodes"]["l40s01"]["reach"]] == ["roce", "roce"]
    hgx = plan["nodes"]["hgx01"]["reach"]
    assert [(r["group"], r["object"]) for r in hgx] == [("ib-fabric", "SR-IOV policy"),
                                                        ("roce", "RDMA shared device plugin")]
    assert hgx[1]["selector"] == {"device_ids": ["15b3:1021"], "link_types": ["eth"]}


def fleet(tmp_path: Path, nics_a: str, nics_b: str, extra: str = "") -> Path:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(textwrap.dedent("""\
        gpuboot:
          cluster_name: lab
          release: k8s-1.36
          control_plane: {vip: 10.0.0.100}
        """) + textwrap.dedent(extra))
    (tmp_path / "group_vars" / "rack_a.yml").write_text("gpuboot_node:\n  nics:\n" + textwrap.indent(
        textwrap.dedent(nics_a), "    "))
    (tmp_path / "group_vars" / "rack_b.yml").write_text("gpuboot_node:\n  nics:\n" + textwrap.indent(
        textwrap.dedent(nics_b), "    "))
    path = tmp_path / "hosts.ini"
    path.write_text("[control_plane]\ncp1\n[rack_a]\nnode-a[1:2]\n[rack_b]\nnode-b1\n"
                    "[workers:children]\nrack_a\nrack_b\n")
    return path


def problems(path: Path) -> list:
    with pytest.raises(InventoryError) as info:
        load_cluster(path)
    return info.value.problems


VF = "- {name: fabric, pf_names: [ens1f0np0], num_vfs: 4, resource_name: nvidia.com/fabric}\n"


@pytest.mark.parametrize("nics_b, path, message", [
    # A policy lists every name its group's nodes use: on rack_b, rack_a's fabric port name is management.
    ("- {name: fabric, pf_names: [ens2f0np0], num_vfs: 4, resource_name: nvidia.com/fabric}\n"
     "- {name: mgmt, pf_names: [ens1f0np0], purpose: management}\n",
     "node-b1.gpuboot_node.nics[1].pf_names", "is its management NIC mgmt, but the SR-IOV policy of NIC group fabric"),
    ("- {name: fabric, pf_names: [ens1f0np0], num_vfs: 8, resource_name: nvidia.com/fabric}\n",
     "node-b1.gpuboot_node.nics[0].num_vfs", "has num_vfs 4 on node-a1 and 8 here"),
    ("- {name: fabric, pci_addresses: ['0000:18:00.0'], num_vfs: 4, resource_name: nvidia.com/fabric}\n",
     "node-b1.gpuboot_node.nics[0]", "selects ports by pf_names on node-a1 and by pci_addresses here"),
    ("- {name: other, pf_names: [ens3f0np0], num_vfs: 4, resource_name: nvidia.com/fabric}\n",
     "node-b1.gpuboot_node.nics[0].resource_name", "resource nvidia.com/fabric is also NIC group fabric's"),
    ("- {name: other, pf_names: [ens3f0np0], num_vfs: 4, resource_name: example.com/other}\n",
     "node-b1.gpuboot_node.nics[0].resource_name", "the SR-IOV operator has one resource prefix"),
    ("- {name: other, device_ids: ['15b3:1021'], mode: both, num_vfs: 4, resource_name: nvidia.com/o}\n",
     "node-b1.gpuboot_node.nics[0]", "set shared_resource_name"),
    ("- {name: other, pf_names: [ens3f0np0], num_vfs: 4, rdma: true, device_type: vfio-pci, "
     "resource_name: nvidia.com/o}\n", "node-b1.gpuboot_node.nics[0]", "cannot be RDMA netdevices"),
    ("- {name: other, pf_names: [ens3f0np0], device_ids: ['15b3:1021'], resource_name: nvidia.com/o}\n",
     "node-b1.gpuboot_node.nics[0]", "pf_names and device_ids are both set"),
    ("- {name: other, pf_names: [ens3f0np0], resource_name: shared_o}\n",
     "node-b1.gpuboot_node.nics[0]", "resource shared_o has no prefix"),
])
def test_nic_misfits_are_located_on_the_node_and_nic(tmp_path, nics_b, path, message):
    found = problems(fleet(tmp_path, VF, nics_b))
    located = [p for p in found if p.path == path and message in p.message + (p.fix or "")]
    assert located, "\n".join(map(str, found))
    assert located[0].file.endswith("rack_b.yml") and located[0].line is not None


@pytest.mark.parametrize("network, message", [
    ("{name: net, ip_pool: {subnet: 192.168.10.0/28, per_node_block_size: 8}}", "2 nodes x per_node_block_size 8 need 16"),
    ("{name: net, ip_pool: {subnet: 10.96.4.0/24}}", "overlaps networking.service_cidr"),
    ("{name: net, ip_pool: {subnet: 192.168.10.0/24, gateway: 192.168.11.1}}", "outside subnet"),
])
def test_secondary_network_pools_must_fit(tmp_path, network, message):
    nics_a = f"- {{name: fabric, pf_names: [ens1f0np0], num_vfs: 4, resource_name: nvidia.com/fabric, network: {network}}}\n"
    found = problems(fleet(tmp_path, nics_a, "- {name: mgmt, pf_names: [eno1], purpose: management}\n"))
    assert any(message in p.message and p.path.startswith("node-a") for p in found), "\n".join(map(str, found))


def test_a_macvlan_network_needs_one_parent_port(tmp_path):
    nics_a = ("- {name: roce, pf_names: [ens1f0np0, ens2f0np0], resource_name: rdma/roce, "
              "network: {name: roce, ip_pool: {subnet: 192.168.10.0/24}}}\n")
    found = problems(fleet(tmp_path, nics_a, "- {name: mgmt, pf_names: [eno1], purpose: management}\n"))
    assert any("a macvlan network has one parent interface" in p.message for p in found), "\n".join(map(str, found))


def test_management_and_storage_ports_make_no_objects(tmp_path):
    cluster = load_cluster(fleet(tmp_path, "- {name: mgmt, pf_names: [eno1], purpose: management}\n",
                                 "- {name: nvme, pf_names: [ens7f0np0], purpose: storage}\n"))
    plan = cluster.nic_plan.as_data()
    assert not plan["enabled"] and plan["sriov_policies"] == [] and plan["shared_config"]["configList"] == []
    assert plan["unload_storage_modules"] is True and plan["node_labels"] == {}
    from gpuboot.phases.catalog import UP
    phase = next(p for p in UP if p.name == "network_operator")
    assert phase.idle(cluster) == "no node declares fabric NICs (RDMA or SR-IOV)"


def test_an_rdma_bandwidth_test_per_infiniband_group_on_two_nodes(tmp_path):
    # The HGX nodes are GPU workers: the test moves GPU memory on both ends (DMA-BUF). The RoCE
    # group gets none (ib_write_bw there needs each pod's RoCE v2 GID index).
    plan = load_cluster(FLEET).nic_plan.as_data()
    assert plan["bandwidth_tests"] == [{"name": "rdma-bw-ib-fabric", "group": "ib-fabric", "server": "hgx01",
                                        "client": "hgx02", "resource": "nvidia.com/ib_vf", "gpudirect": True}]
    assert "bandwidthTest" in plan["operands"]
    # Plain workers over the shared ports: host memory, the shared resource. A group on one
    # node has no pair; VFs for vfio-pci carry no RDMA.
    plan = load_cluster(fleet(tmp_path, nics_a="""\
        - {name: ib, pf_names: [ibp24s0], link_type: ib, mode: rdma_shared, resource_name: nvidia.com/ib_shared}
        - {name: dpdk, pf_names: [ens5f0np0], link_type: eth, num_vfs: 4, device_type: vfio-pci,
           rdma: false, resource_name: nvidia.com/dpdk_vf}
        """, nics_b="- {name: solo, pf_names: [ibp41s0], link_type: ib, num_vfs: 2, resource_name: nvidia.com/solo_vf}\n"
    )).nic_plan.as_data()
    assert plan["bandwidth_tests"] == [{"name": "rdma-bw-ib", "group": "ib", "server": "node-a1", "client": "node-a2",
                                        "resource": "nvidia.com/ib_shared", "gpudirect": False}]


def test_the_network_operator_brings_nfd_only_where_no_gpu_operator_does(tmp_path):
    """The operator places the DOCA driver and the device plugins by Node Feature Discovery's
    labels. One NFD serves a cluster: the GPU Operator's where there are gpu_workers (its phase
    runs first), else the Network Operator chart's, whose image the mirror then plans."""
    workers_only = fleet(tmp_path, VF, VF)
    plan = load_cluster(workers_only).nic_plan
    assert plan.own_nfd and plan.as_data()["nfd"] and "nfd" in plan.operands()
    with_gpus = tmp_path / "with-gpus.ini"
    with_gpus.write_text(workers_only.read_text().replace("[rack_b]\nnode-b1\n", "[rack_b]\n[gpu_workers]\nnode-b1\n")
                         .replace("rack_a\nrack_b\n", "rack_a\nrack_b\ngpu_workers\n"))
    plan = load_cluster(with_gpus).nic_plan
    assert not plan.own_nfd and not plan.as_data()["nfd"] and "nfd" not in plan.operands()
    # No fabric NIC, no Network Operator, no NFD of its.
    (tmp_path / "plain").mkdir()
    assert not load_cluster(fleet(tmp_path / "plain", "[]", "[]")).nic_plan.own_nfd


SHARED = "- {name: fabric, pf_names: [ibs1], link_type: ib, resource_name: nvidia.com/ib_shared}\n"


def shared_fleet(root: Path, gpuboot: str, node_b1: str | None = None) -> Path:
    """Two racks over shared InfiniBand ports; `gpuboot` lines added to gpuboot's settings and,
    given, node-b1's own settings (each case in a folder of its own: Ansible caches what it read)."""
    root.mkdir()
    path = fleet(root, SHARED, SHARED)
    all_yml = root / "group_vars" / "all.yml"
    all_yml.write_text(all_yml.read_text().replace("gpuboot:\n", "gpuboot:\n" + textwrap.indent(gpuboot, "  ")))
    if node_b1 is not None:
        (root / "host_vars").mkdir()
        (root / "host_vars" / "node-b1.yml").write_text("gpuboot_node:\n" + textwrap.indent(node_b1, "  "))
    return path


def planned_images(path: Path) -> list[str]:
    cluster, release = load_cluster(path), matrix.load("k8s-1.36")
    return [str(i.ref) for i in mirror_plan.build(release, mirror_plan.Target.of(cluster, release)).images]


def test_a_fabric_node_on_an_os_without_a_doca_driver_container_needs_the_hosts_driver(tmp_path):
    """NVIDIA publishes the DOCA driver container for some OSes only; for another the Network
    Operator refuses the OS (`distribution not supported`, its state-OFED) and the registry has
    no image. gpuboot refuses such a fabric node where the file says, before any host is touched,
    and network_operator.driver host lets the nodes' own mlx5 driver serve instead."""
    debian = "node_os: {id: debian-12, kernels: [6.1.0-28-amd64]}\n"
    found = problems(shared_fleet(tmp_path / "debian", debian))
    assert {p.path for p in found} == {"node-a1.gpuboot_node.nics", "node-a2.gpuboot_node.nics",
                                       "node-b1.gpuboot_node.nics"}, found
    assert all("no DOCA driver container for debian-12" in p.message and "network_operator.driver: host" in p.fix
               and "ubuntu-22.04" in p.fix for p in found), found
    # A node of another OS, named in its own settings, is fine; one naming Debian itself is
    # told so at its os.
    mixed = shared_fleet(tmp_path / "mixed", debian, "os: ubuntu-22.04\nnics:\n" + textwrap.indent(SHARED, "  "))
    assert {p.path for p in problems(mixed)} == {"node-a1.gpuboot_node.nics", "node-a2.gpuboot_node.nics"}
    own = shared_fleet(tmp_path / "own", "node_os: {id: ubuntu-22.04}\n",
                       "os: debian-12\nnics:\n" + textwrap.indent(SHARED, "  "))
    assert {p.path for p in problems(own)} == {"node-b1.gpuboot_node.os"}

    # The host's driver: no driver container, no init container, no DOCA image in the plan.
    host = shared_fleet(tmp_path / "host", debian + "network_operator: {driver: host}\n")
    plan = load_cluster(host).nic_plan
    assert plan.as_data()["doca_driver"] is False and "initContainer" not in plan.operands()
    images = planned_images(host)
    assert not [i for i in images if "/doca-driver:" in i or "network-operator-init-container" in i], images
    assert any("/k8s-rdma-shared-dev-plugin:" in i for i in images), images

    # An OS with the container keeps it, planned per OS and architecture, with its init container.
    ubuntu = shared_fleet(tmp_path / "ubuntu", "node_os: {id: ubuntu-22.04, kernels: [5.15.0-1048-nvidia]}\n")
    images = planned_images(ubuntu)
    version = matrix.load("k8s-1.36").network_operator["doca_driver_version"]
    assert [i for i in images if "/doca-driver:" in i] == [
        f"nvcr.io/nvidia/mellanox/doca-driver:{version}-ubuntu22.04-amd64"], images
    assert any("network-operator-init-container" in i for i in images), images
