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
