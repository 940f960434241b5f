"""Benchmark: `gpuboot validate`, `gpuboot plan` and `gpuboot render` of large inventories, in YAML (per-host
settings written out; "heavy": eight NIC rails per host written out, about 5 MB) and INI (ranges, settings on the group). Each run
is a fresh `gpuboot` process, as an operator or CI would start it. Not a test: run it by
hand and record the numbers.

    .venv/bin/python -m tests.bench.inventory_scale --workers 11 2000
"""
from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SETTINGS = {"cluster_name": "scale", "release": "k8s-1.36", "control_plane": {"vip": "10.0.0.100"},
            "networking": {"pod_cidr": "10.244.0.0/16", "service_cidr": "10.96.0.0/12"},
            "node_os": {"id": "ubuntu-22.04", "kernels": ["5.15.0-1048-nvidia"]}}
NODE = {"gpu": {"count": 8, "time_slicing_replicas": 4},
        "nics": [{"name": "fabric", "pf_names": [f"ens{j}f0np0" for j in range(8)], "num_vfs": 8,
                  "link_type": "ib", "resource_name": "nvidia.com/cx7_ib", "rdma": True}]}


def heavy_node(i: int) -> dict:
    """A fully written-out HGX node, as an inventory generated from a CMDB has it: eight
    rails, each its own NIC entry selected by PCI address, and the CMDB's own record of every
    rail (PF name and address) beside it (about 2.5 KB per host)."""
    rails = [{"name": f"rail{j}", "pci_addresses": [f"0000:{0x18 + j * 0x10:02x}:00.0"], "num_vfs": 8,
              "link_type": "ib", "resource_name": f"nvidia.com/rail{j}", "rdma": True, "device_type": "netdevice"}
             for j in range(8)]
    cmdb = [{"pf": f"ibp{j * 16 + 24}s0", "pci": f"0000:{0x18 + j * 0x10:02x}:00.0"} for j in range(8)]
    return {"ansible_host": address(i), "ansible_user": "ops", "ansible_port": 22,
            "bmc_address": f"10.250.{(i // 250) % 250}.{i % 250 + 1}", "rack": f"r{i // 32:03d}",
            "asset_serial": f"HGX-{i:08d}", "cmdb_rails": cmdb,
            "gpuboot_node": {"gpu": {"count": 8, "model": "H200-SXM-141GB"}, "nics": rails}}


def address(i: int) -> str:
    return f"10.{1 + i // 62500}.{(i // 250) % 250}.{i % 250 + 1}"


def written_out(root: Path, form: str, hosts: dict) -> Path:
    """A YAML inventory with every GPU worker and its settings written out (no anchors)."""
    data = {"all": {"vars": {"gpuboot": SETTINGS}, "children": {
        "control_plane": {"hosts": {f"cp{i}": {"ansible_host": f"10.0.0.{10 + i}"} for i in (1, 2, 3)}},
        "workers": {"children": {"gpu_workers": {"hosts": hosts}}}}}}
    path = root / form / "inventory.yml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(data, default_flow_style=False))
    return path


def yaml_inventory(root: Path, workers: int) -> Path:
    # Each host its own copy of the settings, as operators write it.
    return written_out(root, "yaml", {f"gpu{i:04d}": {"ansible_host": address(i), "gpuboot_node": copy.deepcopy(NODE)}
                                      for i in range(workers)})


def heavy_inventory(root: Path, workers: int) -> Path:
    return written_out(root, "heavy", {f"gpu{i:04d}": heavy_node(i) for i in range(workers)})


def ini_inventory(root: Path, workers: int) -> Path:
    path = root / "ini" / "hosts.ini"
    (path.parent / "group_vars").mkdir(parents=True)
    path.write_text("[control_plane]\ncp[1:3]\n\n[gpu_workers]\n"
                    f"gpu[0000:{workers - 1:04d}]\n\n[workers:children]\ngpu_workers\n")
    (path.parent / "group_vars" / "all.yml").write_text(yaml.safe_dump({"gpuboot": SETTINGS}))
    (path.parent / "group_vars" / "gpu_workers.yml").write_text(yaml.safe_dump({"gpuboot_node": NODE}))
    return path


def timed(*argv: str, state: Path) -> float:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpuboot", "--state-dir", str(state), *argv],
                          capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"gpuboot {' '.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, nargs="+", default=[11, 2000])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in args.workers:
            for form, make in (("yaml", yaml_inventory), ("heavy", heavy_inventory), ("ini", ini_inventory)):
                root = Path(tmp) / f"{form}-{workers}"
                inventory = make(root, workers)
                size = sum(p.stat().st_size for p in inventory.parent.rglob("*") if p.is_file())
                rows.append({"form": form, "workers": workers, "bytes": size,
                             "validate_s": round(timed("validate", str(inventory), state=root / "state"), 2),
                             "plan_s": round(timed("plan", str(inventory), "--output", "json",
                                                   state=root / "state"), 2),
                             "render_s": round(timed("render", str(inventory), "--out", str(root / "render"),
                                                     state=root / "state"), 2)})
                print(json.dumps(rows[-1]), flush=True)
    print(f"{'form':5} {'workers':>7} {'MB':>6} {'validate s':>10} {'plan s':>7} {'render s':>8}")
    for row in rows:
        print(f"{row['form']:5} {row['workers']:7d} {row['bytes'] / 1e6:6.2f} {row['validate_s']:10.2f} {row['plan_s']:7.2f} {row['render_s']:8.2f}")


if __name__ == "__main__":
    main()
