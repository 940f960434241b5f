"""Errors an operator meets in the first hour, each at the line to edit: the control-plane
count at the group, a VIP that is a node's address at the vip line, one path form for list
items, and a rename hint only towards a name that has no vars file yet."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from gpuboot.cli.main import run
from gpuboot.errors import dotted

TESTS = Path(__file__).resolve().parents[1]
FLEET = TESTS / "fixtures" / "mixed-fleet"
YAML_FORM = TESTS / "corpus" / "forms" / "yaml"


def site(tmp_path: Path, source: Path) -> Path:
    shutil.copytree(source, tmp_path / "site")
    return tmp_path / "site"


def errors(inventory: Path, capsys) -> list[str]:
    assert run(["validate", str(inventory), "--skip-files"]) == 2
    return capsys.readouterr().err.splitlines()[1:]


@pytest.mark.parametrize(("hosts", "count"), [("cp[1:2]", 2), ("cp[1:4]", 4)])
def test_an_even_control_plane_count_is_located_at_the_ini_group(hosts, count, tmp_path, capsys):
    root = site(tmp_path, FLEET)
    ini = root / "hosts.ini"
    ini.write_text(ini.read_text().replace("cp[1:3]", hosts))
    found = errors(ini, capsys)
    assert found == [f"  {ini}:5 control_plane: {count} control-plane hosts ({', '.join(f'cp{i}' for i in range(1, count + 1))}): "
                     f"etcd needs an odd number for quorum (fix: use {count - 1} or {count + 1} control-plane hosts)"]


def test_no_control_plane_is_located_at_the_yaml_group(tmp_path, capsys):
    root = site(tmp_path, YAML_FORM)
    inventory = root / "inventory.yml"
    text = inventory.read_text()
    text = re.sub(r"(    control_plane:\n      hosts:\n)(        cp0\d: \{[^}]*\}\n)+", r"    control_plane:\n      hosts: {}\n", text)
    inventory.write_text(text)
    found = [line for line in errors(inventory, capsys) if "control_plane:" in line]
    assert found and found[0].startswith(f"  {inventory}:13 control_plane: no control-plane hosts: etcd needs an odd number")


def test_a_vip_equal_to_a_nodes_address_is_located_at_the_vip_line(tmp_path, capsys):
    root = site(tmp_path, FLEET)
    ini = root / "hosts.ini"
    ini.write_text(ini.read_text().replace("cp[1:3]", "cp1 ansible_host=10.30.0.100\ncp[2:3]"))
    found = errors(ini, capsys)
    assert found == [f"  {root / 'group_vars' / 'all.yml'}:4 gpuboot.control_plane.vip: the VIP 10.30.0.100 is cp1's "
                     f"address (ansible_host at {ini}:6) (fix: the VIP must be a free address on the control planes' "
                     "network: change the vip here, or cp1's ansible_host)"]


def test_a_leftover_host_vars_file_is_not_told_to_take_a_name_that_has_one(tmp_path, capsys):
    """Two control planes and a leftover host_vars/cp3.yml: cp2 has its own file already."""
    root = site(tmp_path, FLEET)
    ini = root / "hosts.ini"
    ini.write_text(ini.read_text().replace("cp[1:3]", "cp1\ncp2"))
    (root / "host_vars").mkdir()
    for name in ("cp1", "cp2", "cp3"):
        (root / "host_vars" / f"{name}.yml").write_text("node_label: x\n")
    found = [line for line in errors(ini, capsys) if "host_vars file for" in line]
    assert found == [f"  {root / 'host_vars' / 'cp3.yml'}: host_vars file for 'cp3', which the inventory does not "
                     "define; Ansible ignores it (fix: delete it if the host is gone, or add 'cp3' to the inventory)"]
    # Where a near name has no file yet, the rename is still offered (a fresh copy: Ansible
    # caches the vars files it found, per process).
    shutil.copytree(root, tmp_path / "other")
    root = tmp_path / "other"
    ini = root / "hosts.ini"
    (root / "host_vars" / "cp2.yml").unlink()
    found = [line for line in errors(ini, capsys) if "host_vars file for" in line]
    assert found and found[0].endswith("(fix: rename it to 'cp2')")


def test_one_path_form_for_list_items():
    assert dotted("gpuboot", "tenants", 3, "quota", "gpu") == "gpuboot.tenants[3].quota.gpu"
    assert dotted("gpu1", "gpuboot_node", "nics", 0, "pf_names", 1) == "gpu1.gpuboot_node.nics[0].pf_names[1]"
    assert dotted("", "a", None, "b") == "a.b"
    for case in sorted((TESTS / "corpus" / "malformed").glob("*.yml")):
        for path in re.findall(r"^# expect-path: (\S+)", case.read_text(), re.M):
            assert not re.search(r"[A-Za-z_]\.\d+(?=\.|\[|$)", path), f"{case.name}: {path}"
