from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from gpuboot.config.loader import load_cluster
from gpuboot.errors import InventoryError

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "inventories" / "sample" / "inventory.yml"


# The smallest valid inventory, for cases about what lies beside it (group_vars/, host_vars/).
ONE_CONTROL_PLANE = """\
    all:
      vars:
        gpuboot: {cluster_name: b, release: k8s-1.36, control_plane: {vip: 10.0.0.100}}
      children:
        control_plane:
          hosts:
            cp1: {ansible_host: 10.0.0.11}
    """


def write(tmp_path: Path, text: str, name: str = "inventory.yml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_sample_inventory_is_valid_and_complete():
    cluster = load_cluster(SAMPLE)
    assert cluster.settings.cluster_name == "h200-prod"
    assert [n.name for n in cluster.control_planes] == ["cp01", "cp02", "cp03"]
    gpu = {n.name: n for n in cluster.in_group("gpu_workers")}
    assert set(gpu) == {"gpu01", "gpu02"}
    assert gpu["gpu01"].settings.gpu.mig.devices[0].instances == {"1g.18gb": 7}
    assert gpu["gpu02"].settings.nics[0].link_type == "ib"
    # gpu_workers are workers too (child group), the bastion is not a cluster node.
    assert {n.name for n in cluster.in_group("workers")} == {"cpu01", "gpu01", "gpu02"}
    assert "jump01" not in {n.name for n in cluster.cluster_nodes}
    # Settings came from group_vars/all.yml beside the inventory.
    assert any(f.endswith("group_vars/all.yml") for f in cluster.source_files)


def test_error_names_file_line_field_and_fix(tmp_path):
    inv = write(tmp_path, """\
        all:
          vars:
            gpuboot:
              cluster_name: c1
              release: k8s-1.36
              control_plane:
                vip: 10.0.0.300
          children:
            control_plane:
              hosts:
                cp1: {ansible_host: 10.0.0.11}
        """)
    with pytest.raises(InventoryError) as info:
        load_cluster(inv)
    text = str(info.value)
    assert f"{inv}:7 gpuboot.control_plane.vip: 10.0.0.300 is not an IPv4 address" in text
    assert "fix:" in text


def problems(tmp_path: Path, control_plane: str, hosts: int) -> list:
    """What load_cluster reports for an inventory outside the matrix (release: nope), with its
    pod CIDR over the default service CIDR, the control plane given and that many hosts."""
    lines = "\n".join(f"                cp{i}: {{ansible_host: 10.0.0.{10 + i}}}" for i in range(1, hosts + 1))
    inv = write(tmp_path, f"""\
        all:
          vars:
            gpuboot:
              cluster_name: c1
              release: nope
              control_plane: {control_plane}
              networking: {{pod_cidr: 10.96.0.0/16}}
          children:
            control_plane:
              hosts:
{lines}
        """)
    with pytest.raises(InventoryError) as info:
        load_cluster(inv)
    return info.value.problems


def test_every_problem_is_reported_not_only_the_first(tmp_path):
    paths = {p.path for p in problems(tmp_path, "{vip: 10.0.0.100, mode: bogus}", hosts=2)}
    assert {"gpuboot.control_plane.mode", "control_plane"} <= paths


def test_release_and_overlap_reported_together(tmp_path):
    # Once the settings' shape is right, the checks against the matrix and each other report together.
    messages = " | ".join(p.message for p in problems(tmp_path, "{vip: 10.0.0.100}", hosts=1))
    assert "not in the version matrix" in messages and "overlaps service_cidr" in messages


def test_settings_from_group_vars_directory(tmp_path):
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "gpuboot.yml").write_text(
        "gpuboot: {cluster_name: dirvars, release: k8s-1.36, control_plane: {vip: 10.0.0.100}}\n")
    inv = write(tmp_path, "all:\n  children:\n    control_plane:\n      hosts:\n        cp1: {ansible_host: 10.0.0.11}\n")
    cluster = load_cluster(inv)
    assert cluster.settings.cluster_name == "dirvars"
    assert cluster.settings.release == "k8s-1.36"


def test_gpuboot_defined_twice_is_an_error(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(
        "gpuboot: {cluster_name: a, release: k8s-1.36, control_plane: {vip: 10.0.0.100}}\n")
    inv = write(tmp_path, ONE_CONTROL_PLANE)
    with pytest.raises(InventoryError, match="defined in 2 places"):
        load_cluster(inv)


def test_group_vars_file_for_unknown_group_is_flagged(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu_worker.yml").write_text("x: 1\n")
    inv = write(tmp_path, ONE_CONTROL_PLANE)
    with pytest.raises(InventoryError, match="gpu_worker"):
        load_cluster(inv)


def test_check_files_reports_missing_secret_files(tmp_path):
    inv = write(tmp_path, ONE_CONTROL_PLANE.replace("control_plane: {vip: 10.0.0.100}}",
                                                    "control_plane: {vip: 10.0.0.100}, "
                                                    "ssh: {private_key_file: keys/missing}}"))
    assert load_cluster(inv).settings.ssh.private_key_file == "keys/missing"  # validate alone needs no file
    with pytest.raises(InventoryError, match="keys/missing does not exist"):
        load_cluster(inv, check_files=True)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "missing").write_text("x")
    with pytest.raises(InventoryError, match="readable by others"):
        load_cluster(inv, check_files=True)
    (tmp_path / "keys" / "missing").chmod(0o600)
    load_cluster(inv, check_files=True)


def test_each_group_variable_is_defined_in_one_file():
    """A variable set in two group_vars files takes its value from whichever Ansible reads last:
    the two drift apart unseen."""
    owners: dict[str, list[str]] = {}
    for path in sorted((ROOT / "playbooks" / "group_vars").rglob("*.yml")):
        for name in yaml.safe_load(path.read_text()) or {}:
            owners.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert owners and {name: files for name, files in owners.items() if len(files) > 1} == {}


def test_the_model_is_the_one_owner_of_defaults(tmp_path):
    """No playbook or role file restates a default of the settings: Ansible gets the validated
    model as data (gpuboot_settings, gpuboot_nodes); the roles' own defaults are held to their
    specs and to what gpuboot feeds them by tests/unit/test_role_specs.py."""
    scanned = [*(ROOT / "playbooks").rglob("*.yml"), *(ROOT / "roles").rglob("*.yml")]
    assert any(p.name == "inputs.yml" for p in scanned)
    for path in scanned:
        text = path.read_text()
        assert "gpuboot_defaults" not in text, path
        assert "combine(gpuboot" not in text, path
    minimal = load_cluster(write(tmp_path, """\
        all:
          vars:
            gpuboot: {cluster_name: x, release: k8s-1.36, control_plane: {vip: 10.0.0.1, mode: external}}
          children:
            control_plane: {hosts: {cp1: {ansible_host: 10.0.0.11}}}
        """))
    data = minimal.extravars()
    assert data["gpuboot_settings"]["control_plane"]["port"] == 6443  # external: the API servers' port
    assert data["gpuboot_settings"]["networking"]["cni"] == "calico"
    assert data["gpuboot_nodes"] == {"cp1": {"gpu": None, "nics": [], "os": None, "kernel": None}}
