"""gpuboot's dict variables (gpuboot, gpuboot_node) split over a host's groups, its own vars or
several vars files: Ansible replaces a dict whole, so a split that would drop a key is refused
with an error at both places, in every inventory form. A later definition that repeats every
key overrides in peace."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster

TESTS = Path(__file__).resolve().parents[1]
FORMS = TESTS / "corpus" / "forms"
FLEET = TESTS / "fixtures" / "mixed-fleet"
INVENTORIES = {"yaml": "inventory.yml", "ranges": "inventory.yml", "ini": "inventory.ini"}


def site(tmp_path: Path, source: Path) -> Path:
    copy = tmp_path / "site"
    shutil.copytree(source, copy)
    return copy


def validate(inventory: Path, capsys) -> tuple[int, str]:
    code = run(["validate", str(inventory), "--skip-files"])
    return code, capsys.readouterr().err


def add_host_vars(root: Path, text: str) -> tuple[Path, int]:
    """Append to host_vars/gpu02.yml (made if the form has none); the line the text starts on."""
    host_vars = root / "host_vars" / "gpu02.yml"
    host_vars.parent.mkdir(exist_ok=True)
    before = host_vars.read_text() if host_vars.exists() else ""
    host_vars.write_text(before + text)
    return host_vars, len(before.splitlines()) + 1


@pytest.mark.parametrize("form", sorted(INVENTORIES))
def test_a_host_vars_file_that_drops_the_groups_nics_is_refused_in_every_form(form, tmp_path, capsys):
    root = site(tmp_path, FORMS / form)
    host_vars, line_number = add_host_vars(root, "gpuboot_node:\n  gpu: {count: 4, time_slicing_replicas: 2}\n")
    code, err = validate(root / INVENTORIES[form], capsys)
    assert code == 2
    line = next(x for x in err.splitlines() if "is split" in x)
    # The earlier place (the group's or the host's inline definition) and the later one, both named.
    assert "gpuboot_node is split: for gpu02 it is set here and again in" in line
    assert f"{host_vars}:{line_number}" in line
    assert "nics set here would be dropped" in line
    assert "gpu01" not in line


@pytest.mark.parametrize("form", sorted(INVENTORIES))
def test_a_later_definition_that_repeats_every_key_overrides_in_peace(form, tmp_path, capsys):
    root = site(tmp_path, FORMS / form)
    add_host_vars(root, "gpuboot_node:\n  gpu: {count: 4, time_slicing_replicas: 2}\n"
                        "  nics: [{name: fabric, pf_names: [ens1f0np0], num_vfs: 8, resource_name: nvidia.com/cx7}]\n")
    assert validate(root / INVENTORIES[form], capsys)[0] == 0
    nodes = load_cluster(root / INVENTORIES[form]).extravars()["gpuboot_nodes"]
    assert nodes["gpu02"]["gpu"]["count"] == 4 and nodes["gpu02"]["nics"][0]["name"] == "fabric"
    assert nodes["gpu01"]["gpu"]["count"] == 8


def test_a_child_groups_gpus_and_the_parents_nics_are_refused_naming_both_files(tmp_path, capsys):
    """The case as met: NICs in group_vars/gpu_workers.yml, GPUs in the child group's file."""
    root = site(tmp_path, FLEET)
    (root / "group_vars" / "gpu_workers.yml").write_text(
        "gpuboot_node:\n  nics:\n    - {name: management, pf_names: [eno1], purpose: management}\n")
    code, err = validate(root / "hosts.ini", capsys)
    assert code == 2
    assert (f"{root / 'group_vars' / 'gpu_workers.yml'}:1 gpuboot_node: gpuboot_node is split: for h100pcie01 it "
            f"is set here and again in {root / 'group_vars' / 'plain_gpu.yml'}:1") in err
    assert "so nics set here would be dropped" in err


def test_a_nested_key_lost_to_a_partial_override_is_named(tmp_path, capsys):
    root = site(tmp_path, FLEET)
    (root / "group_vars" / "gpu_workers.yml").write_text("gpuboot_node:\n  gpu: {model: H100-PCIE-80GB, count: 2}\n")
    (root / "group_vars" / "plain_gpu.yml").write_text("gpuboot_node:\n  gpu: {count: 1}\n")
    code, err = validate(root / "hosts.ini", capsys)
    assert code == 2 and "so gpu.model set here would be dropped" in err


def test_gpuboot_split_over_the_files_of_group_vars_all_is_refused(tmp_path, capsys):
    root = site(tmp_path, FLEET)
    (root / "group_vars" / "all").mkdir()
    (root / "group_vars" / "all" / "tenants.yml").write_text(
        "gpuboot:\n  tenants:\n    - {name: research, quota: {gpu: 8}}\n")
    code, err = validate(root / "hosts.ini", capsys)
    assert code == 2
    first = err.splitlines()[1]
    assert first.startswith(f"  {root / 'group_vars' / 'all.yml'}:1 gpuboot: gpuboot is split over "
                            "group_vars/all.yml and group_vars/all/tenants.yml")
    assert "cluster_name, release, control_plane" in first


def test_gpuboot_in_inline_all_vars_and_group_vars_all_is_refused_once(tmp_path, capsys):
    root = site(tmp_path, FORMS / "yaml")
    (root / "group_vars").mkdir()
    (root / "group_vars" / "all.yml").write_text("gpuboot:\n  tenants: []\n")
    code, err = validate(root / "inventory.yml", capsys)
    assert code == 2
    assert (f"gpuboot is defined in 2 places ({root / 'inventory.yml'}:4, {root / 'group_vars' / 'all.yml'}:1); "
            "Ansible keeps only the last") in err
    assert "is split" not in err
