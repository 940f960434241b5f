"""Operators run gpuboot as they run Ansible: from the inventory's own folder, with a relative
path. The settings in group_vars/ beside it must be read, and the verbs that load plays in this
process (render, gitops render) must find gpuboot's roles, from any working directory."""
from __future__ import annotations

import shutil
from pathlib import Path

from gpuboot.cli.main import run

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "tests" / "fixtures" / "mixed-fleet"


def test_the_verbs_read_group_vars_beside_a_relative_inventory(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site"
    shutil.copytree(FLEET, site)
    monkeypatch.chdir(site)
    assert run(["validate", "hosts.ini"]) == 0
    assert "valid hosts.ini" in capsys.readouterr().out
    assert run(["plan", "hosts.ini"]) == 0
    assert "hgx01" in capsys.readouterr().out


def test_render_finds_gpuboots_roles_from_another_directory(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site"
    shutil.copytree(FLEET, site)
    monkeypatch.chdir(site)
    assert run(["render", "hosts.ini", "--out", str(tmp_path / "out"), "--phase", "os_prep"]) == 0
    assert (tmp_path / "out" / "hgx01" / "etc" / "sysctl.d" / "90-gpuboot.conf").is_file()
    capsys.readouterr()


def test_plan_shows_what_the_gate_will_demand_of_each_gpu_and_fabric_node(tmp_path, monkeypatch, capsys):
    import json
    site = tmp_path / "site"
    shutil.copytree(FLEET, site)
    monkeypatch.chdir(site)
    assert run(["plan", "hosts.ini"]) == 0
    out = capsys.readouterr().out
    hgx = next(line for line in out.splitlines() if "demands of hgx01:" in line)
    assert "allocatable nvidia.com/gpu=8" in hgx and "gpu.product=NVIDIA-H200" in hgx
    assert "nvidia-driver-daemonset" in hgx and "fabric nvidia.com/ib_vf=32" in hgx
    l40s = next(line for line in out.splitlines() if "demands of l40s01:" in line)
    assert "allocatable nvidia.com/gpu=8" in l40s and "nvidia.com/roce_vf=>0" in l40s  # 4 GPUs x 2 time slices
    assert "demands of cpu01" not in out
    assert run(["plan", "hosts.ini", "--output", "json"]) == 0
    rows = {row["phase"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["validate"]["demands"]["hgx01"][0] == "allocatable nvidia.com/gpu=8"
    assert "demands" not in rows["os_prep"]
