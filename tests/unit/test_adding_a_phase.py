"""Adding a phase is its role (with inputs.yml), its playbook and one catalog entry: this adds a
small one to a copy of gpuboot's content, and the plan, the generated playbook and role inputs,
the result a later run checks and `gpuboot render` all take it up, with nothing else edited."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

import tests.generated as generated
from gpuboot import content
from gpuboot.config.loader import load_cluster
from gpuboot.phases import catalog, planning, render
from gpuboot.state import ClusterState

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "tests" / "corpus" / "forms" / "yaml" / "inventory.yml"

# The new phase's three parts: a role that writes one file from what gpuboot feeds it...
ROLE = {
    "tasks/main.yml": """\
- name: Node banner | the banner
  ansible.builtin.template:
    src: "{{ node_banner_files.banner.src }}"
    dest: "{{ node_banner_files.banner.dest }}"
    owner: root
    group: root
    mode: "{{ node_banner_files.banner.mode }}"
""",
    "vars/main.yml": """\
node_banner_files:
  banner: {src: banner.j2, dest: "{{ node_banner_path }}", mode: "0644"}
""",
    "defaults/main.yml": "node_banner_path: /etc/gpuboot/banner\n",
    "templates/banner.j2": "{{ inventory_hostname }} of cluster {{ node_banner_cluster }}\n",
    "meta/argument_specs.yml": """\
argument_specs:
  main:
    short_description: A banner naming the node's cluster.
    options:
      node_banner_cluster: {type: str, required: true, description: The cluster's name.}
      node_banner_path: {type: path, default: /etc/gpuboot/banner, description: Where the banner goes.}
""",
    "inputs.yml": generated.INPUTS_FILE_HEADER + 'node_banner_cluster: "{{ gpuboot_settings.cluster_name }}"\n',
}
# ...its playbook...
PLAYBOOK = """\
- name: Node banner
  hosts: control_plane:workers
  gather_facts: false
  become: true
  roles:
    - node_banner
"""


@pytest.fixture
def copy(tmp_path, monkeypatch):
    """gpuboot's content copied, the new role and playbook added, and the one catalog entry."""
    for part in ("playbooks", "roles", "mirror"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("molecule", "__pycache__"))
    shutil.copy(ROOT / "ansible.cfg", tmp_path / "ansible.cfg")
    for name, text in ROLE.items():
        (tmp_path / "roles" / "node_banner" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "roles" / "node_banner" / name).write_text(text)
    (tmp_path / "playbooks" / "node_banner.yml").write_text(PLAYBOOK)
    monkeypatch.setenv(content.ENV_VAR, str(tmp_path))
    # Ansible's roles path is set once per process from the content gpuboot runs with (a CLI
    # process has one); this process may have rendered from the checkout already.
    from ansible import constants
    monkeypatch.setattr(constants, "DEFAULT_ROLES_PATH", [str(tmp_path / "roles"), *constants.DEFAULT_ROLES_PATH])
    monkeypatch.setattr(generated, "ROOT", tmp_path)
    for cached in (catalog.role_files, catalog.chart_release):
        cached.cache_clear()
    # ...and the catalog entry, after os_prep.
    phase = catalog.Phase("node_banner", "Node banner", "node_banner.yml",
                          catalog.Result(files=catalog.role_files("node_banner")), node_local=True)
    at = [p.name for p in catalog.UP].index("os_prep") + 1
    up = (*catalog.UP[:at], phase, *catalog.UP[at:])
    for module in (catalog, render):
        monkeypatch.setattr(module, "UP", up)
    # The files made from these, as `python -m tests.generated` writes them.
    (tmp_path / "playbooks" / "up.yml").write_text(generated.up_playbook())
    (tmp_path / "playbooks" / "group_vars" / "all" / "roles.yml").write_text(generated.role_inputs())
    yield tmp_path, phase
    for cached in (catalog.role_files, catalog.chart_release):
        cached.cache_clear()


def test_a_new_phase_is_its_role_its_playbook_and_one_catalog_entry(copy, tmp_path):
    root, phase = copy
    # Ansible's view: the up playbook runs it after os_prep; the role inputs carry what it needs.
    imports = [e["ansible.builtin.import_playbook"] for e in yaml.safe_load((root / "playbooks" / "up.yml").read_text())]
    assert imports[imports.index("os_prep.yml") + 1] == "node_banner.yml"
    inputs = yaml.safe_load((root / "playbooks" / "group_vars" / "all" / "roles.yml").read_text())
    assert inputs["node_banner_cluster"] == "{{ gpuboot_settings.cluster_name }}"
    # The catalog's view: its role from the playbook, its result from the role's own file list.
    assert phase.roles == ("node_banner",)
    assert phase.result_for(None).files == ("/etc/gpuboot/banner",)
    # The plan runs it on the inventory's nodes, in order.
    cluster = load_cluster(INVENTORY)
    rows = planning.describe(cluster, list(catalog.UP), ClusterState.for_cluster(tmp_path / "state", cluster.settings.cluster_name))
    names = [row["phase"] for row in rows]
    assert names[names.index("os_prep") + 1] == "node_banner"
    row = rows[names.index("node_banner")]
    assert row["action"] == "run" and row["hosts"] == phase.hosts_in(cluster) and row["hosts"]
    # render writes its file on each of those hosts, with the input gpuboot fed it.
    out = tmp_path / "rendered"
    written = render.render(cluster, out, ("node_banner",))
    banners = {p.relative_to(out).parts[0]: p.read_text() for p in written if p.name == "banner"}
    assert sorted(banners) == sorted(row["hosts"])
    host = row["hosts"][0]
    assert banners[host] == f"{host} of cluster {cluster.settings.cluster_name}\n"
