"""Preflight's GPU/NIC discovery, fed /sys and /proc trees from a real H100 capture and from
synthetic HGX servers (tests/doubles/hardware). The parsing code is the module the role runs."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuboot import gpus
from tests.doubles.hardware.sysfs import build_tree, hgx_server, load_capture

MODULE_PATH = Path(__file__).resolve().parents[2] / "roles" / "preflight" / "library" / "gpuboot_hardware_facts.py"
spec = importlib.util.spec_from_file_location("gpuboot_hardware_facts", MODULE_PATH)
hw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hw)

FABRIC = {"name": "fabric", "pf_names": ["ens1f0np0", "ens2f0np0"], "num_vfs": 8, "link_type": "eth",
          "resource_name": "nvidia.com/cx7_fabric", "rdma": True}


def discover(facts, tmp_path, nics=()):
    sys_root, proc_root = build_tree(facts, tmp_path / "host")
    return hw.discover(str(sys_root), str(proc_root), list(nics), gpus.catalog_data())


def evaluate(facts, tmp_path, gpu=None, nics=(), expect_gpu=True, module_type="open"):
    found = discover(facts, tmp_path, nics)
    return hw.evaluate(found, expect_gpu, gpu or {}, list(nics), module_type)


def test_real_h100_capture_is_one_open_module_h100(tmp_path):
    found = discover(load_capture("h100-sxm5-vm-capture"), tmp_path)
    assert [(g["pci_address"], g["product"], g["architecture"], g["driver"]) for g in found["gpus"]] == [
        ("0000:00:06.0", "H100 SXM5 80GB", "hopper", "nvidia")]
    assert found["nvidia_driver"] == {"version": "580.159.04", "open": True}
    assert found["nvidia_loaded"] and not found["nouveau_loaded"]
    assert found["secure_boot"] == "not_efi"
    assert found["iommu"] == {"enabled": False, "passthrough": False, "groups": 0, "cmdline": []}
    assert found["nvswitches"] == 0
    # The virtio NIC of the capture is not a ConnectX.
    assert found["connectx"] == []
    assert evaluate(load_capture("h100-sxm5-vm-capture"), tmp_path / "e", gpu={"count": 1, "model": "H100-SXM5-80GB",
                                                                           "mig": {"layout": "all-1g.10gb"}}) == ([], [])


def test_hgx_counts_gpus_not_nvswitches(tmp_path):
    found = discover(hgx_server(gpus=8, nvswitches=4), tmp_path, [FABRIC])
    assert len(found["gpus"]) == 8 and found["nvswitches"] == 4
    assert {g["product"] for g in found["gpus"]} == {"H200 SXM 141GB"}
    assert found["iommu"]["enabled"] and found["iommu"]["passthrough"]
    assert found["secure_boot"] == "disabled"
    nic = {n["selector"]: n for n in found["nics"]}
    assert nic["ens1f0np0"]["vendor"] == "0x15b3" and nic["ens1f0np0"]["sriov_totalvfs"] == 16
    assert nic["ens2f0np0"]["rdma_devices"] == ["mlx5_1"] and nic["ens2f0np0"]["link_type"] == "eth"


def test_a_healthy_hgx_has_no_problems(tmp_path):
    assert evaluate(hgx_server(), tmp_path, gpu={"count": 8, "mig": {"layout": "all-balanced"}},
                    nics=[FABRIC]) == ([], [])


def test_by_pci_address_and_ib_link(tmp_path):
    nic = dict(FABRIC, pf_names=[], pci_addresses=["0000:1a:00.0", "0000:2a:00.0"], link_type="ib")
    assert evaluate(hgx_server(link="ib"), tmp_path, nics=[nic]) == ([], [])


@pytest.mark.parametrize("server, gpu, nics, expected", [
    (hgx_server(gpus=0, nvswitches=0), {}, [], "no NVIDIA GPU found"),
    (hgx_server(gpus=7), {"count": 8}, [], "the inventory expects 8 GPU(s), found 7 (H200 SXM 141GB"),
    (hgx_server(gpu_device="0x26b9"), {"mig": {"layout": "all-1g.6gb"}}, [], "a MIG layout is set but L40S 48GB has no MIG"),
    (hgx_server(), {"model": "H100-SXM5-80GB"}, [], "the inventory says H100-SXM5-80GB, the node has H200 SXM 141GB (PCI device 0x2335)"),
    (hgx_server(gpu_device="0x1db5"), {}, [], "V100 SXM2 32GB (volta) cannot run the open kernel modules"),
    (hgx_server(secure_boot=True), {}, [], "Secure Boot is enabled"),
    (hgx_server(connectx=1), {}, [FABRIC], "NIC fabric port ens2f0np0 does not exist on this host (ConnectX ports found: 0000:1a:00.0)"),
    (hgx_server(sriov_totalvfs=4), {}, [FABRIC], "NIC fabric port ens1f0np0 asks for 8 VFs but supports 4"),
    (hgx_server(sriov_totalvfs=0), {}, [FABRIC], "NIC fabric port ens1f0np0 has no SR-IOV"),
    (hgx_server(link="ib"), {}, [FABRIC], "is in ib mode but the inventory says link_type eth"),
    (hgx_server(iommu=None), {}, [dict(FABRIC, device_type="vfio-pci")], "wants vfio-pci VFs but the IOMMU is off"),
], ids=["no-gpu", "gpu-missing", "mig-on-l40s", "wrong-mig-profile", "volta-open", "secure-boot",
        "missing-port", "too-many-vfs", "no-sriov", "link-type", "vfio-without-iommu"])
def test_each_mismatch_is_a_problem_that_names_what_was_found(tmp_path, server, gpu, nics, expected):
    problems, _ = evaluate(server, tmp_path, gpu=gpu, nics=nics)
    assert any(expected in p for p in problems), problems


def test_a_non_connectx_port_cannot_do_rdma(tmp_path):
    server = hgx_server()
    server["pci"]["0000:1a:00.0"]["vendor"] = "0x8086\n"
    problems, _ = evaluate(server, tmp_path, nics=[FABRIC])
    assert problems == ["NIC fabric port ens1f0np0 is vendor 0x8086, not NVIDIA/Mellanox ConnectX (0x15b3); "
                        "RDMA through the Network Operator needs a ConnectX port"]


@pytest.mark.parametrize("server, expected", [
    (hgx_server(nouveau=True), "nouveau is loaded"),
    (hgx_server(iommu="DMA-FQ"), "add iommu=pt"),
    (hgx_server(gpu_device="0x2bff"), "not in gpuboot's GPU table"),
])
def test_warnings_do_not_fail(tmp_path, server, expected):
    problems, warnings = evaluate(server, tmp_path, gpu={"mig": {"layout": "all-balanced"}}, nics=[FABRIC])
    assert problems == []
    assert any(expected in w for w in warnings), warnings


def host_driver(server, tmp_path, nics):
    found = discover(server, tmp_path, nics)
    return hw.evaluate(found, False, {}, list(nics), "open", nic_driver="host")[0]


def test_with_the_host_driver_each_fabric_port_is_bound_to_mlx5_with_an_rdma_device(tmp_path):
    assert host_driver(hgx_server(), tmp_path / "ok", [FABRIC]) == []
    unbound = hgx_server()
    unbound["pci"]["0000:1a:00.0"]["driver"] = None
    assert host_driver(unbound, tmp_path / "unbound", [FABRIC]) == [
        "NIC fabric port ens1f0np0 (0000:1a:00.0) is bound to no driver, not mlx5_core; with network_operator.driver "
        "host the node's own driver serves the fabric: load it (modprobe mlx5_core) or install DOCA-Host, or set "
        "network_operator.driver container where NVIDIA publishes the DOCA driver container for the node's OS"]
    no_ib = hgx_server()
    no_ib["pci"]["0000:2a:00.0"]["infiniband"] = []
    problems = host_driver(no_ib, tmp_path / "no-ib", [FABRIC])
    assert len(problems) == 1 and problems[0].startswith("NIC fabric port ens2f0np0 (0000:2a:00.0) shows no RDMA device")
    assert "modprobe mlx5_ib ib_uverbs" in problems[0]
    # Ports selected by device id are checked the same way; the DOCA container would load its own.
    by_id = dict(FABRIC, pf_names=[], device_ids=["15b3:1021"])
    assert len(host_driver(unbound, tmp_path / "by-id", [by_id])) == 1
    assert evaluate(unbound, tmp_path / "container", nics=[FABRIC], expect_gpu=False) == ([], [])
    # A management port or a NIC without RDMA is not the Network Operator's to serve.
    management = hgx_server(management=2)
    management["pci"]["0000:c1:00.0"]["driver"] = None
    eno = {"name": "mgmt", "purpose": "management", "pf_names": ["eno1np0"]}
    assert host_driver(management, tmp_path / "mgmt", [FABRIC, eno]) == []
    assert host_driver(unbound, tmp_path / "no-rdma", [dict(FABRIC, rdma=False)]) == []


def test_a_cpu_worker_is_not_asked_for_gpus(tmp_path):
    assert evaluate(hgx_server(gpus=0, nvswitches=0), tmp_path, expect_gpu=False) == ([], [])


def test_the_module_runs_as_ansible_runs_it(tmp_path):
    """Through AnsibleModule's own argument parsing, as Ansible calls it: JSON args in, JSON out."""
    sys_root, proc_root = build_tree(hgx_server(gpus=7), tmp_path / "host")
    args = {"ANSIBLE_MODULE_ARGS": {"expect_gpu": True, "gpu": {"count": 8}, "nics": [FABRIC], "gpu_models": gpus.catalog_data(),
                                    "sys_root": str(sys_root), "proc_root": str(proc_root)}}
    result = subprocess.run([sys.executable, str(MODULE_PATH)], input=json.dumps(args), capture_output=True,
                            text=True, check=False)
    output = json.loads(result.stdout)
    assert output["changed"] is False
    assert len(output["ansible_facts"]["gpuboot_hardware"]["gpus"]) == 7
    assert output["problems"] == ["the inventory expects 8 GPU(s), found 7 (H200 SXM 141GB at 0000:18:00.0, "
                                  "0000:28:00.0, 0000:38:00.0, 0000:48:00.0, 0000:58:00.0, 0000:68:00.0, "
                                  "0000:78:00.0); a GPU may have fallen off the bus"]


def test_documentation_is_valid_yaml():
    import yaml
    doc = yaml.safe_load(hw.DOCUMENTATION)
    assert set(doc["options"]) == {"expect_gpu", "gpu", "gpu_models", "nics", "nic_reach", "address_interface",
                                   "kernel_module_type", "nic_driver", "sys_root", "proc_root"}


# An HGX-like node: eight ConnectX-7 InfiniBand fabric ports, two ConnectX-6 Dx ports in
# bond0, which carries the node's own address.
IB = {"name": "ib-fabric", "pf_names": [f"ens{i}f0np0" for i in range(1, 9)], "num_vfs": 4, "link_type": "ib",
      "resource_name": "nvidia.com/ib_vf"}
MGMT = {"name": "mgmt", "pf_names": ["eno1np0", "eno2np0"], "purpose": "management"}


def select(facts, tmp_path, nics, reach, address="bond0"):
    sys_root, proc_root = build_tree(facts, tmp_path / "host")
    found = hw.discover(str(sys_root), str(proc_root), nics, gpus.catalog_data(), address)
    return found, hw.evaluate(found, False, {}, nics, "open", reach)[0]


def reach(group, obj="SR-IOV policy", **selector):
    return [{"group": group, "object": obj, "selector": selector}]


def test_each_object_takes_exactly_its_group_s_ports(tmp_path):
    hgx = hgx_server(connectx=8, link="ib", management=2, bond=True)
    found, problems = select(hgx, tmp_path, [IB, MGMT], reach("ib-fabric", pf_names=IB["pf_names"]))
    assert problems == []
    assert found["address_ports"] == ["eno1np0", "eno2np0"]  # followed down through bond0
    assert found["nic_ports"] == {"ib-fabric": IB["pf_names"], "mgmt": ["eno1np0", "eno2np0"]}


@pytest.mark.parametrize("nics, selection, expected", [
    # A group selected by vendor:device on another node: here the same device carries management.
    ([MGMT], reach("roce", "RDMA shared device plugin", device_ids=["15b3:101d"], link_types=["eth"]),
     "NIC group roce's RDMA shared device plugin would take port eno1np0 (0000:c1:00.0, 15b3:101d), which "
     "carries this node's own address (through bond0)"),
    # Names listed for other nodes that match a declared management port here (no address on it).
    ([dict(MGMT, pf_names=["eno2np0"])], reach("fabric", pf_names=["ens1f0np0", "eno2np0"]),
     "which carries this node's own address"),
    ([IB, MGMT], reach("other", pf_names=["ens3f0np0"]), "which is NIC group ib-fabric's"),
    ([MGMT], reach("ib-fabric", pf_names=["ens1f0np0"]), "which the inventory does not declare on this node"),
])
def test_an_object_that_would_take_another_port_is_refused(tmp_path, nics, selection, expected):
    _, problems = select(hgx_server(connectx=8, link="ib", management=2, bond=True), tmp_path, nics, selection)
    assert any(expected in p for p in problems), problems


def test_a_declared_management_port_without_the_address_is_still_refused(tmp_path):
    storage = {"name": "nvme", "pf_names": ["ens8f0np0"], "purpose": "storage"}
    _, problems = select(hgx_server(connectx=8, link="ib", management=2, bond=True), tmp_path, [storage],
                         reach("ib-fabric", link_types=["ib"], device_ids=["15b3:1021"]))
    assert any("would also take port ens8f0np0" in p and "its storage NIC nvme" in p for p in problems), problems
    assert sum("does not declare" in p for p in problems) == 7  # the other seven, undeclared here


def test_a_device_id_group_without_such_a_port_is_a_problem(tmp_path):
    nic = {"name": "roce", "device_ids": ["15b3:1017"], "resource_name": "rdma/roce"}
    _, problems = select(hgx_server(), tmp_path, [nic], [])
    assert any("no port of device 15b3:1017" in p for p in problems), problems
