"""Preflight's one read of a node (roles/preflight/library/gpuboot_node_reads.py), run by
ansible-playbook on this machine against a procfs tree and files made here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
# 6443 (0x192B) and 10250 (0x280A) listen; 2379 (0x094B) is an established connection only.
TCP = HEADER + ("   0: 00000000:192B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n"
                "   1: 0100007F:094B 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 2 1\n")
TCP6 = HEADER + "   0: 00000000000000000000000000000000:280A 00000000000000000000000000000000:0000 0A 0 0 0 0 0 3 1\n"


def reads(tmp_path: Path, **args) -> dict:
    playbook = tmp_path / "reads.yml"
    task = {"gpuboot_node_reads": args, "register": "found"}
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False,
                                     "tasks": [task, {"ansible.builtin.copy": {"content": "{{ found | to_json }}",
                                                                               "dest": str(tmp_path / "found.json")}}]}]))
    env = dict(os.environ, ANSIBLE_LIBRARY=str(ROOT / "roles" / "preflight" / "library"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    proc = subprocess.run([sys.executable, "-m", "ansible.cli.playbook", "-i", "localhost,", "-c", "local", str(playbook)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((tmp_path / "found.json").read_text())


def test_one_read_gives_commands_ports_identity_clock_space_and_membership(tmp_path):
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text(TCP)
    (proc / "net" / "tcp6").write_text(TCP6)
    (tmp_path / "machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    (tmp_path / "kubelet.conf").write_text("")
    before = int(time.time())
    found = reads(tmp_path, commands=["sh", "no-such-command-here", "ls"], member_file=str(tmp_path / "kubelet.conf"),
                  proc_root=str(proc), machine_id_file=str(tmp_path / "machine-id"), free_space_path=str(tmp_path))
    assert found["missing_commands"] == ["no-such-command-here"]
    assert found["listening_ports"] == [6443, 10250]
    assert found["machine_id"] == "0123456789abcdef0123456789abcdef"
    assert before <= found["clock"] <= int(time.time())
    space = os.statvfs(tmp_path)
    # df's avail (for unprivileged use), not the root-reserved free count; other writers move it.
    assert 0 < found["free_bytes"] and abs(found["free_bytes"] - space.f_bavail * space.f_frsize) < 2**30
    assert found["member"] is True and found["changed"] is False


def test_a_node_without_ipv6_machine_id_or_kubelet_reads_as_such(tmp_path):
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text(HEADER)
    found = reads(tmp_path, member_file=str(tmp_path / "absent.conf"), proc_root=str(proc),
                  machine_id_file=str(tmp_path / "absent-machine-id"), free_space_path=str(tmp_path))
    assert found["listening_ports"] == [] and found["machine_id"] == "" and found["member"] is False
    assert found["missing_commands"] == []
