"""Preflight on a node where Ansible reads no network facts (no `ip` command: the lent GPU
machine, a minimal image) must still report every problem in its one summary. It used to stop
with a template error (all_ipv4_addresses undefined) before naming any of them; seen on a real
H200 machine (tests/gpu/fixtures). Runs the real playbook with a local connection, leaving out
`ip` out of reach in a mount namespace of its own, as on that machine; read-only, writes nothing
here. Also: inventory hosts that are one machine are each named with the others, as
clones of one image would be."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuboot.config.loader import load_cluster

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "tests" / "gpu" / "inventory" / "hosts.ini"


def preflight(tmp_path: Path, *hosts: str, wrap: list[str] = (), inventory: Path = INVENTORY) -> tuple[int, str]:
    """The real preflight playbook on `hosts` of `inventory`, each over a local connection to
    this machine, with gpuboot's extra variables; its return code and output."""
    extravars = tmp_path / "extravars.json"
    extravars.write_text(json.dumps(load_cluster(inventory).extravars()))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    playbook = [sys.executable, "-m", "ansible.cli.playbook", "-i", str(inventory), "-l", ",".join(hosts), "-c", "local",
                "-e", f"@{extravars}", str(ROOT / "playbooks" / "preflight.yml")]
    proc = subprocess.run([*wrap, *playbook], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    (tmp_path / "preflight.log").write_text(out)
    return proc.returncode, out


def test_preflight_names_its_problems_without_network_facts(tmp_path):
    ip = shutil.which("ip")
    if ip is None or os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root, unshare and an ip command to hide (run as CI does)")
    # /dev/null over the ip binary: Ansible's setup module finds no executable ip, as on that machine.
    hide = f"mount --bind /dev/null {shlex.quote(os.path.realpath(ip))} && exec \"$@\""
    returncode, out = preflight(tmp_path, "gpu1", wrap=["unshare", "-m", "sh", "-c", hide, "sh"])
    assert returncode != 0, out
    assert "Error rendering template" not in out and "UndefinedMarker" not in out, out
    assert "Preflight found problems on 1 host(s)" in out, out
    # The summary says what the node lacks, in the words an operator acts on.
    assert "gpu1: inventory address 127.0.0.21 is not on this host (it has no addresses Ansible could read)" in out
    assert "gpu1: no default route" in out
    assert "gpu1: ip: not found, install iproute2" in out
    # Nothing listens on the loopback VIP: the probe must run and find it free, not fail and
    # be read as an answering VIP.
    assert "VIP 127.0.0.10:8443 already answers" not in out


def test_preflight_names_every_node_that_shares_a_machine_id_or_host_name(tmp_path):
    """Three inventory hosts that are one machine: each is named with the other two, as nodes
    cloned from one image would be, from one list of the play's identities."""
    returncode, out = preflight(tmp_path, "cp1", "gpu1", "gpu2")
    assert returncode != 0 and "Preflight found problems on 3 host(s)" in out, out
    machine_id = Path("/etc/machine-id").read_text().strip()
    name = os.uname().nodename
    for host, others in (("cp1", "gpu1, gpu2"), ("gpu1", "cp1, gpu2"), ("gpu2", "cp1, gpu1")):
        assert f"{host}: machine-id {machine_id} is also on {others} (a cloned image?)" in out, out
        assert f"{host}: host name {name} is also used by {others};" in out, out


def test_preflight_refuses_a_doca_driver_pool_of_two_architectures(tmp_path):
    """NVIDIA's Network Operator (v26.4.1, pkg/nodeinfo: GetNodePools) pools the nodes of its
    DOCA driver container by OS and kernel only, and the pool's DaemonSet pulls the image of
    the first node's architecture: two fabric nodes of one OS and kernel on two architectures
    cannot both be served (found by the real operator in test_real_network_operator.py).
    Preflight names both, before anything is installed. Here both hosts are this machine, one
    declared aarch64 through the role's input, as its fact would say on an Arm server."""
    inventory = tmp_path / "inventory"
    shutil.copytree(INVENTORY.parent, inventory)
    settings = yaml.safe_load((inventory / "group_vars" / "all.yml").read_text())
    settings["gpuboot"]["node_os"]["architectures"] = ["amd64", "arm64"]
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings))
    roce = [{"name": "roce", "pf_names": ["ens1f0np0"], "resource_name": "rdma/roce_shared"}]
    for host in ("gpu1", "gpu2"):
        path = inventory / "host_vars" / f"{host}.yml"
        data = yaml.safe_load(path.read_text())
        data["gpuboot_node"]["nics"] = roce
        if host == "gpu2":
            data["preflight_architecture"] = "aarch64"
        path.write_text(yaml.safe_dump(data))
    returncode, out = preflight(tmp_path, "gpu1", "gpu2", inventory=inventory / "hosts.ini")
    assert returncode != 0, out
    said = " ".join(out.split())
    pool = rf"\S+ {re.escape(os.uname().release)}"  # the OS as gpuboot names it, and the running kernel
    assert re.search(rf"gpu1: DOCA driver: this node \(x86_64\) runs {pool} as gpu2 on another architecture do; "
                     r"NVIDIA's Network Operator pools", said), said[-4000:]
    assert re.search(rf"gpu2: DOCA driver: this node \(aarch64\) runs {pool} as gpu1 on another architecture do", said)
    assert "gpuboot.network_operator.driver: host" in said

    # One architecture: no such problem (the others the hosts have stay).
    (inventory / "host_vars" / "gpu2.yml").write_text(yaml.safe_dump(
        {k: v for k, v in yaml.safe_load((inventory / "host_vars" / "gpu2.yml").read_text()).items()
         if k != "preflight_architecture"}))
    returncode, out = preflight(tmp_path, "gpu1", "gpu2", inventory=inventory / "hosts.ini")
    assert "DOCA driver:" not in out, out[-4000:]
