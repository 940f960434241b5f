"""A molecule scenario's pass is reused only while every input of it is unchanged: the role with
its scenario, the shared config, the release file and doubles it names, the node image and the
variables molecule and Ansible read; another role's double is not its input. The scenarios run
in tests/integration/test_molecule.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuboot_lab import molecule

IMAGE = "localhost/gpuboot-node:abc"


@pytest.fixture
def content_copy(tmp_path, monkeypatch):
    """A copy of the content tree with the roles and parts asked for, that the keys read."""
    copy = tmp_path / "content"
    source = molecule.content.content_dir()

    def make(roles: tuple[str, ...], parts: tuple[str, ...]) -> Path:
        for part in ("playbooks", "mirror"):
            (copy / part).mkdir(parents=True, exist_ok=True)
        for role in roles:
            shutil.copytree(source / "roles" / role, copy / "roles" / role)
        for part in parts:
            shutil.copytree(source / part, copy / part)
        monkeypatch.setenv("GPUBOOT_CONTENT_DIR", str(copy))
        return copy
    return make


def edit(path: Path, note: str = "an edit") -> None:
    path.write_text(path.read_text() + f"\n# {note}\n")


def test_a_scenario_is_reused_only_while_its_inputs_are_unchanged(content_copy, monkeypatch):
    copy = content_copy(("os_prep", "kube_packages"), (".config", "mirror/releases"))
    key = molecule.scenario_key("os_prep", IMAGE)
    assert key == molecule.scenario_key("os_prep", IMAGE)
    assert key != molecule.scenario_key("os_prep", "localhost/gpuboot-node:def")  # another image
    edit(copy / "roles" / "os_prep" / "tasks" / "main.yml")
    assert key != molecule.scenario_key("os_prep", IMAGE)
    before = molecule.scenario_key("os_prep", IMAGE)
    edit(copy / "roles" / "os_prep" / "molecule" / "default" / "verify.yml", "the scenario changed")
    assert before != molecule.scenario_key("os_prep", IMAGE)
    # The shared config (driver, platforms, test sequence), a release file the scenario reads,
    # a variable molecule or Ansible reads: each is an input.
    release = copy / "mirror" / "releases" / "k8s-1.36.yml"
    for changed, role in ((copy / ".config" / "molecule" / "config.yml", "os_prep"), (release, "kube_packages")):
        before = molecule.scenario_key(role, IMAGE)
        edit(changed)
        assert before != molecule.scenario_key(role, IMAGE), changed
    before = molecule.scenario_key("os_prep", IMAGE)
    monkeypatch.setenv("ANSIBLE_STRATEGY", "free")
    assert before != molecule.scenario_key("os_prep", IMAGE)


def test_a_scenario_key_follows_the_doubles_it_names_and_no_other(content_copy):
    """A scenario that copies in a test double is run again when that double changes; an edit
    to another role's double (or to a double no scenario uses) leaves its pass standing."""
    copy = content_copy(("kubeadm_join", "os_prep"), ("tests/doubles",))
    join, prep = molecule.scenario_key("kubeadm_join", IMAGE), molecule.scenario_key("os_prep", IMAGE)
    edit(copy / "tests" / "doubles" / "kubeadm_join" / "kubeadm", "the double changed")
    changed = molecule.scenario_key("kubeadm_join", IMAGE)
    assert changed != join
    assert molecule.scenario_key("os_prep", IMAGE) == prep
    edit(copy / "tests" / "doubles" / "kubelet_double.py", "a double no scenario names")
    assert molecule.scenario_key("kubeadm_join", IMAGE) == changed
    assert molecule.scenario_key("os_prep", IMAGE) == prep


def test_a_scenario_key_follows_the_gpuboot_modules_its_role_calls_and_no_other(content_copy):
    """A role calling gpuboot_packages is run again when that module or its module_utils change;
    an edit to a module it does not call leaves its pass standing, and a role calling none
    keeps its pass through both."""
    copy = content_copy(("kube_packages", "kubeadm_init"), ("playbooks/library", "playbooks/module_utils"))
    packages, init = molecule.scenario_key("kube_packages", IMAGE), molecule.scenario_key("kubeadm_init", IMAGE)
    edit(copy / "playbooks" / "library" / "gpuboot_lock.py", "a module kube_packages does not call")
    assert molecule.scenario_key("kube_packages", IMAGE) == packages
    for changed in (copy / "playbooks" / "module_utils" / "gpuboot_packages.py",
                    copy / "playbooks" / "library" / "gpuboot_packages.py"):
        edit(changed)
        assert molecule.scenario_key("kube_packages", IMAGE) != packages, changed
        packages = molecule.scenario_key("kube_packages", IMAGE)
    assert molecule.scenario_key("kubeadm_init", IMAGE) == init
