#!/usr/bin/env python3
"""Capture the hardware facts preflight reads, from a real machine, as one JSON file.

Run on a GPU server (or the lent GPU machine): python3 capture.py OUT.json
The JSON is the source of the fixture /sys and /proc trees that tests/doubles/hardware/sysfs.py
builds; the same parsing code (roles/preflight/library/gpuboot_hardware_facts.py) reads
them. Only the attributes preflight reads are kept; nothing secret is read. Standalone on
purpose (stdlib only, copied to a machine without this repository's environment), so its two
tiny file helpers repeat the module's instead of importing it."""
import glob
import json
import os
import platform
import subprocess
import sys

PCI_ATTRS = ("vendor", "device", "class", "subsystem_vendor", "subsystem_device", "numa_node",
             "sriov_totalvfs", "sriov_numvfs", "current_link_speed", "current_link_width")


def read(path):
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return {"hex": data.hex()}


def read_hex(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().hex()
    except OSError:
        return None


def link_name(path):
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def run(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def main(out):
    pci = {}
    for dev in sorted(glob.glob("/sys/bus/pci/devices/*")):
        entry = {attr: read(os.path.join(dev, attr)) for attr in PCI_ATTRS}
        entry = {k: v for k, v in entry.items() if v is not None}
        entry["driver"] = link_name(os.path.join(dev, "driver"))
        entry["iommu_group"] = link_name(os.path.join(dev, "iommu_group"))
        entry["net"] = sorted(os.listdir(os.path.join(dev, "net"))) if os.path.isdir(os.path.join(dev, "net")) else []
        entry["infiniband"] = (sorted(os.listdir(os.path.join(dev, "infiniband")))
                               if os.path.isdir(os.path.join(dev, "infiniband")) else [])
        pci[os.path.basename(dev)] = entry
    net = {}
    for iface in sorted(glob.glob("/sys/class/net/*")):
        net[os.path.basename(iface)] = {
            "device": link_name(os.path.join(iface, "device")),
            "type": read(os.path.join(iface, "type")),
            "operstate": read(os.path.join(iface, "operstate")),
        }
    facts = {
        "uname_r": platform.release(),
        "os_release": read("/etc/os-release"),
        "proc_cmdline": read("/proc/cmdline"),
        "proc_modules": read("/proc/modules"),
        "pci": pci,
        "net": net,
        "infiniband": {os.path.basename(d): link_name(os.path.join(d, "device"))
                       for d in sorted(glob.glob("/sys/class/infiniband/*"))},
        "iommu_devices": sorted(os.path.basename(p) for p in glob.glob("/sys/class/iommu/*")),
        "iommu_groups": {os.path.basename(g): read(os.path.join(g, "type"))
                         for g in sorted(glob.glob("/sys/kernel/iommu_groups/*"))},
        "efi": os.path.isdir("/sys/firmware/efi"),
        "secure_boot_efivar": read_hex("/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"),
        "nvidia_driver_version": read("/proc/driver/nvidia/version"),
        "lspci_mm_nn": run(["lspci", "-mm", "-nn", "-D"]),
        "nvidia_smi_query": run(["nvidia-smi", "--query-gpu=index,pci.bus_id,name,memory.total,mig.mode.current,driver_version",
                                 "--format=csv,noheader"]),
    }
    with open(out, "w") as handle:
        json.dump(facts, handle, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1])
