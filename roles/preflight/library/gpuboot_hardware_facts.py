#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Read-only GPU, NIC, IOMMU and Secure Boot discovery from /sys and /proc, and the problems
it finds against what the inventory says the node has."""
from __future__ import annotations

DOCUMENTATION = r"""
module: gpuboot_hardware_facts
short_description: Discover NVIDIA GPUs, RDMA/SR-IOV NICs, IOMMU and Secure Boot; compare with the inventory
description:
  - Reads PCI devices from sysfs (vendor 0x10de GPUs, 0x15b3 ConnectX NICs), loaded modules,
    the NVIDIA driver version, IOMMU mode and the Secure Boot EFI variable. Never changes anything.
  - Returns the facts as C(gpuboot_hardware) and every mismatch with the inventory in C(problems).
options:
  expect_gpu: {type: bool, default: false, description: The node is a GPU worker and must have NVIDIA GPUs.}
  gpu: {type: dict, default: {}, description: "The node's gpuboot_node.gpu settings (model, count, mig)."}
  gpu_models: {type: dict, default: {}, description: "gpuboot's GPU table (mirror/gpus.yml): name -> product, pci_devices, architecture, mig."}
  nics: {type: list, elements: dict, default: [], description: "The node's gpuboot_node.nics."}
  nic_reach:
    type: list
    elements: dict
    default: []
    description: "What the Network Operator's objects select on this node: group, object and selector (pf_names,
      pci_addresses, device_ids, link_types), as gpuboot resolved them over every node they reach."
  address_interface: {type: str, default: "", description: "The interface holding the node's own address (bonds and VLANs are followed down)."}
  kernel_module_type: {type: str, default: open, description: "The release's GPU driver kernel module type (open, proprietary, auto)."}
  nic_driver:
    type: str
    default: container
    choices: [container, host]
    description: "gpuboot.network_operator.driver: with host no DOCA driver container loads mlx5, so each fabric
      RDMA port must already be bound to mlx5_core and show an RDMA device."
  sys_root: {type: path, default: /sys, description: Where sysfs is mounted (another root reads a captured tree).}
  proc_root: {type: path, default: /proc, description: Where procfs is mounted.}
"""

import glob
import os

NVIDIA = "0x10de"
MELLANOX = "0x15b3"
MLX5 = "mlx5_core"
SECURE_BOOT_VAR = "efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

# The open kernel modules (and so GPUDirect over DMA-BUF) need Turing or newer.
PRE_TURING = ("kepler", "maxwell", "pascal", "volta")


def read(root, *parts):
    try:
        with open(os.path.join(root, *parts)) as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def link_name(path):
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def pci_device(sys_root, address):
    base = os.path.join(sys_root, "bus", "pci", "devices", address)
    if not os.path.isdir(base):
        return None
    totalvfs = read(base, "sriov_totalvfs")
    return {
        "pci_address": address,
        "vendor": read(base, "vendor"),
        "device_id": read(base, "device"),
        "class": read(base, "class") or "",
        "driver": link_name(os.path.join(base, "driver")),
        "numa_node": int(read(base, "numa_node") or -1),
        "sriov_totalvfs": int(totalvfs) if totalvfs and totalvfs.isdigit() else 0,
        "sriov_numvfs": int(read(base, "sriov_numvfs") or 0),
        "interfaces": sorted(os.listdir(os.path.join(base, "net"))) if os.path.isdir(os.path.join(base, "net")) else [],
        "rdma_devices": (sorted(os.listdir(os.path.join(base, "infiniband")))
                         if os.path.isdir(os.path.join(base, "infiniband")) else []),
    }


def pci_devices(sys_root):
    for path in sorted(glob.glob(os.path.join(sys_root, "bus", "pci", "devices", "*"))):
        device = pci_device(sys_root, os.path.basename(path))
        if device:
            yield device


def loaded_modules(proc_root):
    text = read(proc_root, "modules") or ""
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def nvidia_driver(proc_root):
    text = read(proc_root, "driver", "nvidia", "version")
    if not text:
        return None
    first = text.splitlines()[0]
    version = next((word for word in first.split() if word.count(".") >= 1 and word.replace(".", "").isdigit()), None)
    return {"version": version, "open": "Open Kernel Module" in first}


def iommu_state(sys_root, proc_root):
    cmdline = (read(proc_root, "cmdline") or "").split()
    groups = sorted(glob.glob(os.path.join(sys_root, "kernel", "iommu_groups", "*")))
    units = glob.glob(os.path.join(sys_root, "class", "iommu", "*"))
    types = {read(group, "type") for group in groups} - {None}
    passthrough = ("identity" in types or "iommu=pt" in cmdline or "iommu.passthrough=1" in cmdline)
    return {"enabled": bool(groups or units), "passthrough": bool(groups or units) and passthrough,
            "groups": len(groups), "cmdline": [arg for arg in cmdline if "iommu" in arg]}


def secure_boot(sys_root):
    efi = os.path.join(sys_root, "firmware", "efi")
    if not os.path.isdir(efi):
        return "not_efi"
    try:
        with open(os.path.join(efi, SECURE_BOOT_VAR), "rb") as handle:
            data = handle.read()
    except OSError:
        return "unknown"
    # 4 bytes of variable attributes, then the value: 1 means enforcing.
    return "enabled" if len(data) >= 5 and data[4] == 1 else "disabled"


def gpu_entry(device, models):
    name, model = next(((n, m) for n, m in models.items() if device["device_id"] in m["pci_devices"]),
                       (None, {"product": f"NVIDIA device {device['device_id']}", "architecture": "unknown", "mig": None}))
    return {"pci_address": device["pci_address"], "device_id": device["device_id"], "model": name,
            "product": model["product"], "architecture": model["architecture"], "mig": model["mig"],
            "driver": device["driver"], "numa_node": device["numa_node"]}


def resolve_nic(sys_root, selector):
    """A PF named by interface or PCI address -> its PCI device, or None when absent."""
    if ":" in selector:
        return pci_device(sys_root, selector)
    address = link_name(os.path.join(sys_root, "class", "net", selector, "device"))
    device = pci_device(sys_root, address) if address else None
    if device is None and os.path.isdir(os.path.join(sys_root, "class", "net", selector)):
        return {"pci_address": None, "vendor": None, "device_id": None, "interfaces": [selector],
                "sriov_totalvfs": 0, "rdma_devices": [], "driver": None}
    return device


def link_type(sys_root, interfaces):
    kinds = {read(sys_root, "class", "net", name, "type") for name in interfaces}
    return "ib" if "32" in kinds else "eth" if "1" in kinds else None


def net_ports(sys_root):
    """Every network port backed by a PCI function that is not a VF: interface -> its facts."""
    ports = {}
    base = os.path.join(sys_root, "class", "net")
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        address = link_name(os.path.join(base, name, "device"))
        device = pci_device(sys_root, address) if address else None
        if device is None or os.path.exists(os.path.join(sys_root, "bus", "pci", "devices", address, "physfn")):
            continue
        ports[name] = {"ifname": name, "pci_address": address, "vendor": device["vendor"],
                       "device_id": device["device_id"], "link_type": link_type(sys_root, [name]),
                       "driver": device["driver"], "rdma_devices": device["rdma_devices"]}
    return ports


def lower_ports(sys_root, name, ports, depth=0):
    """The ports under an interface: itself, or those its bond or VLAN sits on (lower_* links)."""
    if name in ports:
        return [name]
    base = os.path.join(sys_root, "class", "net", name)
    if depth > 4 or not os.path.isdir(base):
        return []
    found = []
    for entry in sorted(os.listdir(base)):
        if entry.startswith("lower_"):
            found += lower_ports(sys_root, entry[len("lower_"):], ports, depth + 1)
    return found


def _selects(port, selector):
    """Whether a selector (every key it has must match) takes a port."""
    values = {"pf_names": port["ifname"], "pci_addresses": (port["pci_address"] or "").lower(),
              "device_ids": "{0}:{1}".format((port["vendor"] or "")[2:], (port["device_id"] or "")[2:]),
              "link_types": port["link_type"]}
    return all(values[key] in [v.lower() if key == "pci_addresses" else v for v in wanted]
               for key, wanted in selector.items())


def declared_ports(nic, ports):
    """The ports a NIC of the inventory names on this node."""
    selector = {k: nic[k] for k in ("pf_names", "pci_addresses", "device_ids") if nic.get(k)}
    return sorted(name for name, port in ports.items() if selector and _selects(port, selector))


def selection_problems(facts, nics, reach):
    """Each operator object must take exactly its group's ports here: never a management or
    storage port, another group's port, an undeclared port, or the port of the node's address."""
    ports, problems = facts["ports"], []
    owner = {}
    for nic in nics:
        for name in declared_ports(nic, ports):
            owner.setdefault(name, nic)
    own_address = set(facts["address_ports"])
    for item in reach:
        what = "NIC group {0}'s {1}".format(item["group"], item["object"])
        taken = sorted(n for n, p in ports.items() if p["vendor"] == MELLANOX and _selects(p, item["selector"]))
        for name in taken:
            port = ports[name]
            nic = owner.get(name)
            seen = "{0} ({1}, {2}:{3})".format(name, port["pci_address"], (port["vendor"] or "")[2:],
                                               (port["device_id"] or "")[2:])
            if name in own_address:
                problems.append("{0} would take port {1}, which carries this node's own address (through {2}); the "
                                "operator would cut the node off: select {3}'s ports so that {4} is not one of them"
                                .format(what, seen, facts["address_interface"], item["group"], name))
            elif nic is None:
                problems.append("{0} would also take port {1}, which the inventory does not declare on this node; "
                                "declare it (purpose: management or storage keeps it out) or narrow {2}'s selector"
                                .format(what, seen, item["group"]))
            elif nic.get("name") != item["group"]:
                role = ("its {0} NIC {1}".format(nic.get("purpose"), nic.get("name"))
                        if nic.get("purpose", "fabric") != "fabric" else "NIC group {0}'s".format(nic.get("name")))
                problems.append("{0} would also take port {1}, which is {2}; the operator must never touch it: "
                                "select {3}'s ports by names or addresses that {4} does not have"
                                .format(what, seen, role, item["group"], name))
    return problems


def discover(sys_root, proc_root, nics, models, address_interface=""):
    devices = list(pci_devices(sys_root))
    ports = net_ports(sys_root)
    modules = loaded_modules(proc_root)
    nic_facts = []
    for nic in nics:
        for selector in list(nic.get("pf_names") or []) + list(nic.get("pci_addresses") or []):
            device = resolve_nic(sys_root, selector)
            nic_facts.append({"nic": nic.get("name"), "selector": selector, "found": device is not None,
                              **({"pci_address": device["pci_address"], "vendor": device["vendor"],
                                  "device_id": device["device_id"], "driver": device["driver"],
                                  "interfaces": device["interfaces"], "rdma_devices": device["rdma_devices"],
                                  "sriov_totalvfs": device["sriov_totalvfs"],
                                  "link_type": link_type(sys_root, device["interfaces"])} if device else {})})
    return {
        # Display and 3D controllers only: NVSwitches (class 0x0680) and audio functions share the vendor.
        "gpus": [gpu_entry(d, models) for d in devices if d["vendor"] == NVIDIA and d["class"].startswith("0x03")],
        "nvswitches": sum(1 for d in devices if d["vendor"] == NVIDIA and d["class"].startswith("0x0680")),
        "connectx": [d["pci_address"] for d in devices if d["vendor"] == MELLANOX and d["class"].startswith("0x02")],
        "nouveau_loaded": "nouveau" in modules,
        "nvidia_loaded": "nvidia" in modules,
        "nvidia_driver": nvidia_driver(proc_root),
        "iommu": iommu_state(sys_root, proc_root),
        "secure_boot": secure_boot(sys_root),
        "nics": nic_facts,
        "ports": ports,
        "address_interface": address_interface,
        "address_ports": lower_ports(sys_root, address_interface, ports) if address_interface else [],
        # Each NIC's ports as this node has them (device_ids: every port of that device).
        "nic_ports": {nic.get("name"): declared_ports(nic, ports) for nic in nics},
    }


def gpu_problems(facts, gpu, kernel_module_type):
    """(problems, warnings) of a GPU worker against its inventory settings."""
    problems, warnings = [], []
    gpus = facts["gpus"]
    found = ", ".join(sorted({g["product"] for g in gpus})) or "none"
    if not gpus:
        problems.append("no NVIDIA GPU found (PCI vendor 0x10de, display/3D class) but the node is in gpu_workers; "
                        "check the GPUs are seated and visible (lspci -d 10de:), or move the node to workers")
        return problems, warnings
    expected = gpu.get("count")
    if expected is not None and expected != len(gpus):
        problems.append(f"the inventory expects {expected} GPU(s), found {len(gpus)} ({found} at "
                        f"{', '.join(g['pci_address'] for g in gpus)}); a GPU may have fallen off the bus")
    if len({g["device_id"] for g in gpus}) > 1:
        problems.append(f"mixed GPU models on one node ({found}); one MIG/time-slicing setting cannot fit both")
    declared = gpu.get("model")
    if declared and any(g["model"] != declared for g in gpus):
        problems.append(f"the inventory says {declared}, the node has {found} (PCI device "
                        f"{', '.join(sorted({g['device_id'] for g in gpus}))}); fix gpu.model or check the node")
    mig = gpu.get("mig") or {}
    wants_mig = bool(mig.get("devices") and any(d.get("instances") for d in mig["devices"])
                     or mig.get("layout") not in (None, "all-disabled"))
    for product in sorted({g["product"] for g in gpus}):
        sample = next(g for g in gpus if g["product"] == product)
        if wants_mig and sample["mig"] is False:
            problems.append(f"a MIG layout is set but {product} has no MIG; remove gpu.mig "
                            "(use time_slicing_replicas to share it)")
        elif wants_mig and sample["mig"] is None:
            warnings.append(f"{product} is not in gpuboot's GPU table; MIG support was not checked")
        if kernel_module_type == "open" and sample["architecture"] in PRE_TURING:
            problems.append(f"{product} ({sample['architecture']}) cannot run the open kernel modules this release "
                            "uses; they need Turing or newer")
    if facts["secure_boot"] == "enabled":
        problems.append("Secure Boot is enabled: the GPU Operator's driver container loads kernel modules that are not "
                        "signed with a key this host trusts; disable Secure Boot in firmware or enroll a signing key "
                        "and use signed drivers")
    if facts["nouveau_loaded"]:
        warnings.append("nouveau is loaded; os_prep blacklists it, and the node needs a reboot before the GPU driver "
                        "can load")
    return problems, warnings


def nic_problems(facts, nics):
    problems = []
    for nic in nics:
        if nic.get("device_ids") and not facts["nic_ports"].get(nic.get("name")):
            problems.append("NIC {0}: no port of device {1} on this host (ConnectX ports found: {2})".format(
                nic.get("name"), ", ".join(nic["device_ids"]), ", ".join(facts["connectx"]) or "none"))
    by_selector = {(n["nic"], n["selector"]): n for n in facts["nics"]}
    for nic in nics:
        for selector in list(nic.get("pf_names") or []) + list(nic.get("pci_addresses") or []):
            seen = by_selector[(nic.get("name"), selector)]
            where = f"NIC {nic.get('name')} port {selector}"
            if not seen["found"]:
                problems.append(f"{where} does not exist on this host (ConnectX ports found: "
                                f"{', '.join(facts['connectx']) or 'none'})")
                continue
            if nic.get("rdma", True) and seen["vendor"] != MELLANOX:
                problems.append(f"{where} is vendor {seen['vendor']}, not NVIDIA/Mellanox ConnectX ({MELLANOX}); "
                                "RDMA through the Network Operator needs a ConnectX port")
            wanted_vfs = int(nic.get("num_vfs") or 0)
            if wanted_vfs and not seen["sriov_totalvfs"]:
                problems.append(f"{where} has no SR-IOV (sriov_totalvfs is 0 or missing); enable SR-IOV in the NIC "
                                "firmware (mlxconfig SRIOV_EN=1 NUM_OF_VFS=N) and in BIOS")
            elif wanted_vfs > seen["sriov_totalvfs"]:
                problems.append(f"{where} asks for {wanted_vfs} VFs but supports {seen['sriov_totalvfs']} "
                                "(sriov_totalvfs); lower num_vfs or raise NUM_OF_VFS with mlxconfig")
            wanted_link = nic.get("link_type") or "eth"
            if seen["link_type"] and seen["link_type"] != wanted_link:
                problems.append(f"{where} is in {seen['link_type']} mode but the inventory says link_type {wanted_link}; "
                                "fix link_type or set LINK_TYPE_P1 with mlxconfig")
            if nic.get("device_type") == "vfio-pci" and not facts["iommu"]["enabled"]:
                problems.append(f"{where} wants vfio-pci VFs but the IOMMU is off; add intel_iommu=on (or amd_iommu=on) "
                                "to the kernel command line")
    return problems


def host_driver_problems(facts, nics):
    """With network_operator.driver host no DOCA driver container loads mlx5: each fabric port
    that does RDMA must already be bound to the node's mlx5_core and show an RDMA device
    (mlx5_ib), or the operator's device plugins find nothing to advertise."""
    problems = []
    for nic in nics:
        if nic.get("purpose", "fabric") != "fabric" or not nic.get("rdma", True):
            continue
        for name in declared_ports(nic, facts["ports"]):
            port = facts["ports"][name]
            if port["vendor"] != MELLANOX:
                continue  # named by nic_problems
            where = f"NIC {nic.get('name')} port {name} ({port['pci_address']})"
            if port["driver"] != MLX5:
                problems.append(f"{where} is bound to {port['driver'] or 'no driver'}, not {MLX5}; with "
                                "network_operator.driver host the node's own driver serves the fabric: load it "
                                "(modprobe mlx5_core) or install DOCA-Host, or set network_operator.driver container "
                                "where NVIDIA publishes the DOCA driver container for the node's OS")
            elif not port["rdma_devices"]:
                problems.append(f"{where} shows no RDMA device; with network_operator.driver host the node's own "
                                "mlx5_ib and ib_uverbs must be loaded: modprobe mlx5_ib ib_uverbs, and list them "
                                "in /etc/modules-load.d so that they load at boot")
    return problems


def evaluate(facts, expect_gpu, gpu, nics, kernel_module_type, reach=(), nic_driver="container"):
    problems, warnings = gpu_problems(facts, gpu or {}, kernel_module_type) if expect_gpu else ([], [])
    problems += nic_problems(facts, nics)
    if nic_driver == "host":
        problems += host_driver_problems(facts, nics)
    problems += selection_problems(facts, nics, reach)
    if nics and any(n.get("rdma", True) for n in nics) and facts["iommu"]["enabled"] and not facts["iommu"]["passthrough"]:
        warnings.append("the IOMMU translates DMA; GPUDirect RDMA is much slower that way: add iommu=pt to the "
                        "kernel command line")
    return problems, warnings


def main():
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(argument_spec={
        "expect_gpu": {"type": "bool", "default": False},
        "gpu": {"type": "dict", "default": {}},
        "gpu_models": {"type": "dict", "default": {}},
        "nics": {"type": "list", "elements": "dict", "default": []},
        "nic_reach": {"type": "list", "elements": "dict", "default": []},
        "address_interface": {"type": "str", "default": ""},
        "kernel_module_type": {"type": "str", "default": "open", "choices": ["open", "proprietary", "auto"]},
        "nic_driver": {"type": "str", "default": "container", "choices": ["container", "host"]},
        "sys_root": {"type": "path", "default": "/sys"},
        "proc_root": {"type": "path", "default": "/proc"},
    }, supports_check_mode=True)
    params = module.params
    facts = discover(params["sys_root"], params["proc_root"], params["nics"], params["gpu_models"],
                     params["address_interface"])
    problems, warnings = evaluate(facts, params["expect_gpu"], params["gpu"], params["nics"],
                                  params["kernel_module_type"], params["nic_reach"], params["nic_driver"])
    for warning in warnings:
        module.warn(warning)
    module.exit_json(changed=False, ansible_facts={"gpuboot_hardware": facts}, problems=problems)


if __name__ == "__main__":
    main()
