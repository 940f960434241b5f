"""Inventories as operators write them (host ranges, INI, group_vars/ and host_vars/,
settings on groups) mean to gpuboot exactly what they mean to Ansible: the three forms
under tests/corpus/forms describe one cluster, and gpuboot sees one cluster."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.errors import InventoryError

FORMS = Path(__file__).resolve().parents[1] / "corpus" / "forms"
INVENTORIES = {"yaml": FORMS / "yaml" / "inventory.yml", "ranges": FORMS / "ranges" / "inventory.yml",
               "ini": FORMS / "ini" / "inventory.ini"}


def view(path: Path) -> dict:
    cluster = load_cluster(path)
    return {"extravars": cluster.extravars(),
            "nodes": {n.name: (n.address, n.port, sorted(n.groups), n.role) for n in cluster.nodes}}


@pytest.mark.parametrize("form", ["ranges", "ini"])
def test_every_form_is_the_same_cluster(form):
    want, got = view(INVENTORIES["yaml"]), view(INVENTORIES[form])
    assert got == want
    # Group-level gpuboot_node reached both GPU workers, with the model's defaults filled in.
    nodes = got["extravars"]["gpuboot_nodes"]
    assert nodes["gpu01"]["gpu"]["time_slicing_replicas"] == 2 and nodes["gpu02"]["nics"][0]["num_vfs"] == 8
    assert nodes["gpu01"]["nics"][0]["link_type"] == "eth"


@pytest.mark.parametrize("form", ["ranges", "ini"])
def test_plan_is_the_same_for_every_form(form, capsys):
    rows = {}
    for name in ("yaml", form):
        assert run(["plan", str(INVENTORIES[name]), "--output", "json"]) == 0
        rows[name] = json.loads(capsys.readouterr().out)
    assert rows[form] == rows["yaml"]
    assert sorted({r["phase"]: r["hosts"] for r in rows[form]}["workers_join"]) == ["cp01", "cpu01", "gpu01", "gpu02"]


def write(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / next(iter(files))


SETTINGS = """\
    gpuboot:
      cluster_name: g
      release: k8s-1.36
      control_plane: {vip: 10.0.0.100}
    """


def test_a_wrong_value_set_on_a_group_is_found_where_it_is_written(tmp_path):
    inventory = write(tmp_path, {
        "hosts.ini": "[control_plane]\ncp1 ansible_host=10.0.0.11\n\n[gpu_workers]\ngpu[01:16] \n\n"
                     "[workers:children]\ngpu_workers\n",
        "group_vars/all.yml": SETTINGS,
        "group_vars/gpu_workers.yml": """\
            gpuboot_node:
              gpu:
                count: 8
                driver: bogus
              nics:
                - {name: fabric, pf_names: [ens1f0np0], num_vfs: 300, resource_name: nvidia.com/cx7}
            """})
    with pytest.raises(InventoryError) as info:
        load_cluster(inventory)
    problems = info.value.problems
    where = {(p.path, Path(p.file).name, p.line) for p in problems}
    # Reported once per host that inherits it, at the line in group_vars/gpu_workers.yml.
    assert ("gpu01.gpuboot_node.gpu.driver", "gpu_workers.yml", 4) in where
    assert ("gpu16.gpuboot_node.nics[0].num_vfs", "gpu_workers.yml", 6) in where


def test_a_host_outside_every_gpuboot_group_is_refused_unless_ignored(tmp_path):
    files = {"inventory.yml": """\
        all:
          children:
            control_plane: {hosts: {cp1: {ansible_host: 10.0.0.11}}}
            monitoring: {hosts: {prom01: {ansible_host: 10.0.0.50}}}
          hosts:
            stray01: {ansible_host: 10.0.0.51}
        """, "group_vars/all.yml": SETTINGS}
    inventory = write(tmp_path, files)
    with pytest.raises(InventoryError) as info:
        load_cluster(inventory)
    named = {p.path: p for p in info.value.problems}
    assert set(named) == {"prom01", "stray01"}
    assert named["prom01"].line == 4 and "gpuboot.ignored_hosts" in named["prom01"].fix
    (tmp_path / "group_vars/all.yml").write_text(textwrap.dedent(SETTINGS) + "  ignored_hosts: [monitoring, stray01]\n")
    cluster = load_cluster(inventory)
    assert {n.name for n in cluster.cluster_nodes} == {"cp1"}


def test_an_ini_inventory_that_ansible_cannot_read_names_the_line(tmp_path):
    inventory = write(tmp_path, {"hosts.ini": "[control_plane]\ncp1 ansible_host=10.0.0.11\n[workers:children\nw1\n"})
    with pytest.raises(InventoryError) as info:
        load_cluster(inventory)
    assert any("ini inventory" in p.message for p in info.value.problems), info.value.problems


def rendered_tree(inventory: Path, out: Path) -> dict[str, str]:
    from gpuboot.phases.render import render
    files = render(load_cluster(inventory), out, ())
    return {str(p.relative_to(out)): p.read_text() for p in files}


@pytest.mark.parametrize("form", ["ranges", "ini"])
def test_render_is_the_same_for_every_form(form, tmp_path):
    want = rendered_tree(INVENTORIES["yaml"], tmp_path / "yaml")
    got = rendered_tree(INVENTORIES[form], tmp_path / form)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
    assert "gpu02/etc/modprobe.d/gpuboot-blacklist-nouveau.conf" in got
