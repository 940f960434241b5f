"""Files the inventory names (`*_file`): a relative path is the inventory's own file and
stays inside its folder, through '..' and symlinks alike; a secret is readable by its owner
alone; each problem is located at the setting, before any host is touched."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from gpuboot.config.loader import load_cluster
from gpuboot.errors import InventoryError

BASE = Path(__file__).resolve().parents[1] / "corpus" / "forms" / "yaml" / "inventory.yml"


@pytest.fixture
def site(tmp_path):
    """An inventory folder, a secret outside it, and a writer of the inventory's settings."""
    folder = tmp_path / "site"
    (folder / "secrets").mkdir(parents=True)
    outside = tmp_path / "operator-secrets" / "registry.json"
    outside.parent.mkdir()
    for secret in (outside, folder / "secrets" / "registry.json"):
        secret.touch(mode=0o600)
        secret.write_text('{"username": "u", "password": "p"}')

    def write(**mirror) -> Path:
        data = yaml.safe_load(BASE.read_text())
        data["all"]["vars"]["gpuboot"]["mirror"] = mirror
        path = folder / "inventory.yml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path
    return folder, outside, write


def _problem(path: Path, field: str):
    with pytest.raises(InventoryError) as caught:
        load_cluster(path, check_files=True)
    located = [p for p in caught.value.problems if p.path == field]
    assert len(located) == 1, [str(p) for p in caught.value.problems]
    assert located[0].file == str(path) and located[0].line
    return located[0]


def test_files_inside_the_folder_or_named_absolutely_are_accepted(site):
    folder, outside, write = site
    (folder / "secrets" / "current.json").symlink_to("registry.json")  # a symlink that stays inside
    load_cluster(write(credentials_file="secrets/current.json"), check_files=True)
    load_cluster(write(credentials_file=str(outside)), check_files=True)


def test_a_symlink_out_of_the_folder_is_refused(site):
    folder, outside, write = site
    (folder / "secrets" / "linked.json").symlink_to(outside)
    problem = _problem(write(credentials_file="secrets/linked.json"), "gpuboot.mirror.credentials_file")
    assert "outside the inventory's folder" in problem.message and "symlink" in problem.message
    assert str(outside) in problem.message


def test_dot_dot_out_of_the_folder_is_refused(site):
    _, _, write = site
    problem = _problem(write(credentials_file="../operator-secrets/registry.json"), "gpuboot.mirror.credentials_file")
    assert "outside the inventory's folder" in problem.message and "'..'" in problem.message
    assert "absolute path" in problem.fix


def test_a_secret_others_can_read_is_refused_with_the_chmod(site):
    folder, _, write = site
    secret = folder / "secrets" / "registry.json"
    secret.chmod(0o644)
    problem = _problem(write(credentials_file="secrets/registry.json"), "gpuboot.mirror.credentials_file")
    assert "readable by others (mode 0644)" in problem.message and problem.fix == f"chmod 600 {secret}"


def test_a_certificate_may_be_public_but_must_be_a_file(site):
    folder, _, write = site
    (folder / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    os.chmod(folder / "ca.crt", 0o644)
    load_cluster(write(ca_file="ca.crt"), check_files=True)
    problem = _problem(write(ca_file="secrets"), "gpuboot.mirror.ca_file")
    assert problem.message == "secrets is not a regular file"


def test_an_executor_key_is_a_secret_located_at_its_executor(site):
    folder, _, write = site
    path = write()
    data = yaml.safe_load(path.read_text())
    key = folder / "secrets" / "executor_ed25519"
    key.write_text("PLANTED")
    key.chmod(0o640)
    data["all"]["vars"]["gpuboot"]["executors"] = [{"name": "ex1", "address": "10.0.0.9"},
                                                   {"name": "ex2", "address": "10.0.0.10",
                                                    "private_key_file": "secrets/executor_ed25519"}]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    problem = _problem(path, "gpuboot.executors[1].private_key_file")
    assert "readable by others (mode 0640)" in problem.message and problem.fix == f"chmod 600 {key}"
    key.chmod(0o600)
    assert [e.name for e in load_cluster(path, check_files=True).settings.executors] == ["ex1", "ex2"]
