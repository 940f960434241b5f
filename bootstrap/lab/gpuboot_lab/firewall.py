"""An nftables table that fences the lab subnet: nothing from it leaves the machine,
nothing from outside reaches into it. The host itself (apt cache, registry) stays reachable."""
from __future__ import annotations

import shutil
import subprocess
from ipaddress import IPv4Network

from gpuboot_lab.errors import LabError


def table_name(lab: str) -> str:
    return f"gpuboot_{lab}".replace("-", "_")


def install(lab: str, subnet: IPv4Network) -> str:
    if shutil.which("nft") is None:
        raise LabError("nft is not installed", hint="apt-get install nftables")
    table = table_name(lab)
    # Priority -10 runs before podman's own forward rules, which would accept the traffic.
    rules = f"""
table inet {table} {{
  chain forward {{
    type filter hook forward priority -10; policy accept;
    ip saddr {subnet} ip daddr != {subnet} counter drop
    ip daddr {subnet} ip saddr != {subnet} counter drop
  }}
}}
"""
    remove(lab)
    proc = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"installing firewall table {table} failed: {proc.stderr.strip()}")
    return table


def exists(lab: str) -> bool:
    return subprocess.run(["nft", "list", "table", "inet", table_name(lab)],
                          capture_output=True).returncode == 0


def remove(lab: str) -> None:
    if shutil.which("nft") and exists(lab):
        subprocess.run(["nft", "delete", "table", "inet", table_name(lab)], check=True, capture_output=True)
