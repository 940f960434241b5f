"""A TEST DOUBLE for GPU server hardware: builds /sys and /proc trees from captured facts.

The lab has no GPU and no ConnectX NIC. Preflight's discovery module reads a /sys and /proc
root, so tests feed it a tree built here from a capture (tests/fixtures/hardware/*.json, written
by capture.py on a real machine) or from a synthetic server assembled with the same attribute
formats. The tree has what the kernel shows: attribute files ending in a newline, `driver`,
`iommu_group` and class `device` entries as symlinks, and the SecureBoot EFI variable in binary."""
from __future__ import annotations

import copy
import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hardware"
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
PCI_ATTRS = ("vendor", "device", "class", "subsystem_vendor", "subsystem_device", "numa_node",
             "sriov_totalvfs", "sriov_numvfs", "current_link_speed", "current_link_width")
ARPHRD = {"eth": "1\n", "ib": "32\n"}


def load_capture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def build_tree(facts: dict, root: Path) -> tuple[Path, Path]:
    """Write facts as <root>/sys and <root>/proc; returns (sys_root, proc_root)."""
    sys_root, proc_root = root / "sys", root / "proc"
    devices = sys_root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    proc_root.mkdir()
    for address, attrs in facts["pci"].items():
        device = devices / address
        device.mkdir()
        for attr in PCI_ATTRS:
            if attrs.get(attr) is not None:
                (device / attr).write_text(attrs[attr])
        if attrs.get("driver"):
            driver = sys_root / "bus" / "pci" / "drivers" / attrs["driver"]
            driver.mkdir(parents=True, exist_ok=True)
            (device / "driver").symlink_to(driver)
        if attrs.get("iommu_group") is not None:
            group = sys_root / "kernel" / "iommu_groups" / attrs["iommu_group"]
            group.mkdir(parents=True, exist_ok=True)
            (device / "iommu_group").symlink_to(group)
        for kind in ("net", "infiniband"):
            for name in attrs.get(kind) or []:
                (device / kind / name).mkdir(parents=True)
    for group, kind in (facts.get("iommu_groups") or {}).items():
        path = sys_root / "kernel" / "iommu_groups" / group
        path.mkdir(parents=True, exist_ok=True)
        if kind is not None:
            (path / "type").write_text(kind)
    for unit in facts.get("iommu_devices") or []:
        (sys_root / "class" / "iommu" / unit).mkdir(parents=True)
    for name, attrs in facts["net"].items():
        iface = sys_root / "class" / "net" / name
        iface.mkdir(parents=True)
        for attr in ("type", "operstate"):
            if attrs.get(attr) is not None:
                (iface / attr).write_text(attrs[attr])
        for lower in attrs.get("lower") or []:  # a bond's or VLAN's ports
            (iface / f"lower_{lower}").symlink_to(Path("..") / lower)
        target = attrs.get("device")
        if target and target in facts["pci"]:
            (iface / "device").symlink_to(devices / target)
        elif target:  # a virtio or platform device, outside the PCI tree
            other = sys_root / "devices" / "virtual" / target
            other.mkdir(parents=True, exist_ok=True)
            (iface / "device").symlink_to(other)
    if facts.get("efi"):
        efivars = sys_root / "firmware" / "efi" / "efivars"
        efivars.mkdir(parents=True)
        if facts.get("secure_boot_efivar"):
            (efivars / SECURE_BOOT_VAR).write_bytes(bytes.fromhex(facts["secure_boot_efivar"]))
    for name, key in (("cmdline", "proc_cmdline"), ("modules", "proc_modules")):
        (proc_root / name).write_text(facts.get(key) or "")
    if facts.get("nvidia_driver_version"):
        (proc_root / "driver" / "nvidia").mkdir(parents=True)
        (proc_root / "driver" / "nvidia" / "version").write_text(facts["nvidia_driver_version"])
    return sys_root, proc_root


def hgx_server(gpu_device: str = "0x2335", gpus: int = 8, nvswitches: int = 4, connectx: int = 2,
               sriov_totalvfs: int = 16, link: str = "eth", iommu: str | None = "identity",
               secure_boot: bool | None = False, nouveau: bool = False, management: int = 0,
               bond: bool = False) -> dict:
    """A synthetic HGX-class GPU server in the capture's format: GPUs at the captured H100's
    attribute values, NVSwitches (class 0x0680, same vendor), ConnectX-7 ports (0x15b3:0x1021)
    with netdevs ens<N>f0np0 and RDMA devices mlx5_<N>; `management` ConnectX-6 Dx Ethernet
    ports (0x15b3:0x101d) eno<N>np0, with `bond` a bond0 over them (the node's own address)."""
    base = load_capture("h100-sxm5-vm-capture")
    captured_gpu = next(v for v in base["pci"].values() if v["vendor"] == "0x10de\n")
    facts = copy.deepcopy(base)
    facts["pci"] = {a: v for a, v in base["pci"].items() if v["vendor"] != "0x10de\n"}
    group = iter(range(100, 1000))
    for index in range(gpus):
        gpu = dict(captured_gpu, device=f"{gpu_device}\n", numa_node=f"{index // 4}\n",
                   driver="nouveau" if nouveau else captured_gpu["driver"])
        gpu["iommu_group"] = str(next(group)) if iommu else None
        facts["pci"][f"0000:{0x18 + index * 0x10:02x}:00.0"] = gpu
    for index in range(nvswitches):
        facts["pci"][f"0000:{0x05 + index:02x}:00.0"] = {
            "vendor": "0x10de\n", "device": "0x22a3\n", "class": "0x068000\n", "numa_node": "0\n",
            "driver": None, "iommu_group": str(next(group)) if iommu else None, "net": [], "infiniband": []}
    for index in range(connectx):
        address = f"0000:{0x1a + index * 0x10:02x}:00.0"
        netdev = f"ens{index + 1}f0np0"
        facts["pci"][address] = {
            "vendor": "0x15b3\n", "device": "0x1021\n", "class": "0x020700\n" if link == "ib" else "0x020000\n",
            "numa_node": f"{index}\n", "driver": "mlx5_core", "sriov_totalvfs": f"{sriov_totalvfs}\n",
            "sriov_numvfs": "0\n", "iommu_group": str(next(group)) if iommu else None,
            "net": [netdev], "infiniband": [f"mlx5_{index}"]}
        facts["net"][netdev] = {"device": address, "type": ARPHRD[link], "operstate": "up\n"}
    for index in range(management):
        address = f"0000:{0xc1 + index:02x}:00.0"
        netdev = f"eno{index + 1}np0"
        facts["pci"][address] = {
            "vendor": "0x15b3\n", "device": "0x101d\n", "class": "0x020000\n", "numa_node": "0\n",
            "driver": "mlx5_core", "sriov_totalvfs": "8\n", "sriov_numvfs": "0\n",
            "iommu_group": str(next(group)) if iommu else None, "net": [netdev],
            "infiniband": [f"mlx5_{connectx + index}"]}
        facts["net"][netdev] = {"device": address, "type": ARPHRD["eth"], "operstate": "up\n"}
    if bond and management:
        facts["net"]["bond0"] = {"type": ARPHRD["eth"], "operstate": "up\n",
                                 "lower": [f"eno{i + 1}np0" for i in range(management)]}
    facts["iommu_groups"] = {g: f"{iommu}\n" for g in (v.get("iommu_group") for v in facts["pci"].values()) if g} \
        if iommu else {}
    facts["iommu_devices"] = ["dmar0", "dmar1"] if iommu else []
    facts["efi"] = secure_boot is not None
    facts["secure_boot_efivar"] = None if secure_boot is None else ("06000000" + ("01" if secure_boot else "00"))
    modules = base["proc_modules"] if not nouveau else "nouveau 2777088 0 - Live 0xffffffffc1000000\n"
    facts["proc_modules"] = modules
    if nouveau:
        facts["nvidia_driver_version"] = None
    return facts
