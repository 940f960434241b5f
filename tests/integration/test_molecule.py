"""Every role's molecule scenario (check, converge, idempotence, verify) through the harness."""
from __future__ import annotations

import pytest

from gpuboot_lab.molecule import roles_with_scenarios, run_scenarios

pytestmark = [pytest.mark.lab, pytest.mark.slow]


def test_every_role_has_a_scenario():
    from gpuboot import content
    roles = sorted(p.name for p in (content.content_dir() / "roles").iterdir() if p.is_dir())
    assert roles_with_scenarios() == roles


def test_molecule_scenarios_pass(tmp_path, lab):
    # `lab` is requested only so that a machine without the lab skips (or fails in CI) the same way.
    results = run_scenarios(tmp_path, log=lambda m: None)
    failed = {r.role: r.log.read_text()[-3000:] for r in results if not r.ok}
    assert not failed, failed
    assert {r.role for r in results} == set(roles_with_scenarios())


def test_a_scenario_is_reused_only_while_its_inputs_are_unchanged(tmp_path, monkeypatch):
    from gpuboot_lab import molecule
    copy = tmp_path / "content"
    for part in ("playbooks", "mirror"):
        (copy / part).mkdir(parents=True)
    import shutil
    shutil.copytree(molecule.content.content_dir() / "roles" / "os_prep", copy / "roles" / "os_prep")
    monkeypatch.setenv("GPUBOOT_CONTENT_DIR", str(copy))
    key = molecule.scenario_key("os_prep", "localhost/gpuboot-node:abc")
    assert key == molecule.scenario_key("os_prep", "localhost/gpuboot-node:abc")
    assert key != molecule.scenario_key("os_prep", "localhost/gpuboot-node:def")  # another image
    tasks = copy / "roles" / "os_prep" / "tasks" / "main.yml"
    tasks.write_text(tasks.read_text() + "\n# an edit\n")
    assert key != molecule.scenario_key("os_prep", "localhost/gpuboot-node:abc")
    verify = copy / "roles" / "os_prep" / "molecule" / "default" / "verify.yml"
    before = molecule.scenario_key("os_prep", "localhost/gpuboot-node:abc")
    verify.write_text(verify.read_text() + "\n# the scenario changed\n")
    assert before != molecule.scenario_key("os_prep", "localhost/gpuboot-node:abc")


def test_a_scenario_key_follows_the_doubles_it_names_and_no_other(tmp_path, monkeypatch):
    """A scenario that copies in a test double is run again when that double changes; an edit
    to another role's double (or to a double no scenario uses) leaves its pass standing."""
    import shutil

    from gpuboot_lab import molecule
    copy = tmp_path / "content"
    for part in ("playbooks", "mirror"):
        (copy / part).mkdir(parents=True)
    source = molecule.content.content_dir()
    for role in ("kubeadm_join", "os_prep"):
        shutil.copytree(source / "roles" / role, copy / "roles" / role)
    shutil.copytree(source / "tests" / "doubles", copy / "tests" / "doubles")
    monkeypatch.setenv("GPUBOOT_CONTENT_DIR", str(copy))
    image = "localhost/gpuboot-node:abc"
    join, prep = molecule.scenario_key("kubeadm_join", image), molecule.scenario_key("os_prep", image)
    double = copy / "tests" / "doubles" / "kubeadm_join" / "kubeadm"
    double.write_text(double.read_text() + "\n# the double changed\n")
    changed = molecule.scenario_key("kubeadm_join", image)
    assert changed != join
    assert molecule.scenario_key("os_prep", image) == prep
    other = copy / "tests" / "doubles" / "gpu_operator" / "operator.py"
    other.write_text(other.read_text() + "\n# a double no scenario names\n")
    assert molecule.scenario_key("kubeadm_join", image) == changed
    assert molecule.scenario_key("os_prep", image) == prep
