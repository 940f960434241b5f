"""One owner for settings, two ways in: `gpuboot up` hands Ansible the validated settings as
the runner adapter's extra-variables file; plain `ansible-playbook -i INVENTORY ... -e
@DIR/cluster/settings.yml` reads the file `gpuboot render` writes. Real ansible-playbook,
run both ways over an operator-style inventory (INI, ranges, group_vars/), must give every
role the same value for every input the playbooks set (playbooks/group_vars/all/roles.yml)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from gpuboot.ansible.runner import PlaybookRun, _extravars_file
from gpuboot.config.loader import load_cluster
from gpuboot.phases.render import write_settings

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "tests" / "corpus" / "forms" / "ini" / "inventory.ini"
# argocd's inputs are the gitops_handoff phase's own: they read the rendered repository, which
# `gpuboot up` passes to that phase only (tests/unit/test_gitops_handoff.py, the lab's handoff).
ROLE_INPUTS = sorted(name for name in yaml.safe_load((ROOT / "playbooks" / "group_vars" / "all" / "roles.yml").read_text())
                     if not name.startswith("argocd_"))

# Run from a directory whose group_vars/ is playbooks/group_vars/, so it applies as it does to
# every phase.
DUMP = """\
- name: Role inputs of every node
  hosts: all
  gather_facts: true
  connection: local
  vars:
    # ha_endpoint runs on the control planes only (its inputs index them).
    gpuboot_test_here: >-
      {{ gpuboot_test_inputs if inventory_hostname in groups['control_plane']
         else gpuboot_test_inputs | reject('match', 'ha_endpoint_') | list }}
  tasks:
    - name: Write this node's role inputs
      ansible.builtin.copy:
        content: "{{ dict(gpuboot_test_here | zip(gpuboot_test_here | map('extract', vars))) | to_json }}"
        dest: "{{ gpuboot_test_out }}/{{ inventory_hostname }}.json"
        mode: "0600"
"""


def role_inputs(extra_vars_file: Path, out: Path, playbook: Path, tmp_path: Path) -> dict[str, dict]:
    out.mkdir()
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / f"facts-{out.name}"))
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(INVENTORY),
                           "-e", f"@{extra_vars_file}", "-e", json.dumps({"gpuboot_test_out": str(out),
                                                                         "gpuboot_test_inputs": ROLE_INPUTS,
                                                                         # every node is this machine
                                                                         "ansible_python_interpreter": sys.executable}),
                           str(playbook)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_gpuboot_and_plain_ansible_playbook_give_every_role_the_same_inputs(tmp_path):
    cluster = load_cluster(INVENTORY)
    playbook = tmp_path / "playbooks" / "role-inputs.yml"
    playbook.parent.mkdir()
    (playbook.parent / "group_vars").symlink_to(ROOT / "playbooks" / "group_vars")
    playbook.write_text(DUMP)
    # gpuboot's way: the file the runner adapter hands ansible-playbook.
    through_gpuboot = Path(_extravars_file(PlaybookRun(
        playbook=playbook, inventory=INVENTORY, artifact_dir=tmp_path / "artifacts", ident="inputs",
        extravars=cluster.extravars())))
    # The plain way: the settings file `gpuboot render` writes.
    plain = tmp_path / "render" / "cluster" / "settings.yml"
    write_settings(cluster, plain)
    got = role_inputs(through_gpuboot, tmp_path / "gpuboot", playbook, tmp_path)
    want = role_inputs(plain, tmp_path / "plain", playbook, tmp_path)
    assert sorted(got) == sorted(n.name for n in cluster.nodes)
    assert got == want
    # The values are the settings', not empty: a check that cannot pass on nothing.
    gpu = got["gpu01"]
    assert gpu["os_prep_blacklist_nouveau"] is True and got["cp01"]["os_prep_blacklist_nouveau"] is False
    assert gpu["kubeadm_init_pod_subnet"] == str(cluster.settings.networking.pod_cidr)
    assert got["cp02"]["ha_endpoint_backends"] == {n.name: n.address for n in cluster.in_group("control_plane")}
    assert got["cp02"]["ha_endpoint_unicast_peers"] == ["10.30.0.11", "10.30.0.13"]
    assert gpu["container_runtime_upstream_registries"] == cluster.extravars()["gpuboot_release"]["upstream_registries"]
    assert len(ROLE_INPUTS) > 40 and all(name in got["cp01"] for name in ROLE_INPUTS)
