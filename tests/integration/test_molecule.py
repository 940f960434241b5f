"""Every role's molecule scenario (check, converge, idempotence, verify) through the harness."""
from __future__ import annotations

import pytest

from gpuboot_lab.molecule import ScenarioRunner, roles_with_scenarios

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="module")
def results(lab, tmp_path_factory):
    """Every scenario's result, run two at a time (ha_endpoint alone, after the others)."""
    # `lab` is requested only so that a machine without the lab skips (or fails in CI) the same way.
    with ScenarioRunner(tmp_path_factory.mktemp("molecule"), log=lambda m: None) as scenarios:
        yield scenarios.run_all(roles_with_scenarios())


def test_every_role_has_a_scenario():
    from gpuboot import content
    roles = sorted(p.name for p in (content.content_dir() / "roles").iterdir() if p.is_dir())
    assert roles_with_scenarios() == roles


@pytest.mark.parametrize("role", roles_with_scenarios())
def test_molecule_scenario_passes(results, role):
    """check, converge, idempotence, verify. A scenario whose inputs passed before on this
    machine is reported as skipped (REUSED), with the record it stands on."""
    result = results[role]
    if result.cached:
        pytest.skip(f"REUSED: {role}'s scenario passed on this machine with identical inputs; record "
                    f"{result.log}; GPUBOOT_MOLECULE_FRESH=1 runs it")
    assert result.ok, f"{role}: molecule test failed after {result.seconds}s; log {result.log}:\n" \
                      + result.log.read_text()[-3000:]


def test_a_scenario_is_reused_only_while_its_inputs_are_unchanged(tmp_path, monkeypatch):
    from gpuboot_lab import molecule
    copy = tmp_path / "content"
    for part in ("playbooks", "mirror"):
        (copy / part).mkdir(parents=True)
    import shutil
    source = molecule.content.content_dir()
    for role in ("os_prep", "kube_packages"):
        shutil.copytree(source / "roles" / role, copy / "roles" / role)
    shutil.copytree(source / ".config", copy / ".config")
    shutil.copytree(source / "mirror" / "releases", copy / "mirror" / "releases")
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
    # The shared config (driver, platforms, test sequence), a release file the scenario reads,
    # a variable molecule or Ansible reads: each is an input.
    release = copy / "mirror" / "releases" / "k8s-1.36.yml"
    for edit, role in ((copy / ".config" / "molecule" / "config.yml", "os_prep"), (release, "kube_packages")):
        before = molecule.scenario_key(role, "localhost/gpuboot-node:abc")
        edit.write_text(edit.read_text() + "\n# changed\n")
        assert before != molecule.scenario_key(role, "localhost/gpuboot-node:abc"), edit
    before = molecule.scenario_key("os_prep", "localhost/gpuboot-node:abc")
    monkeypatch.setenv("ANSIBLE_STRATEGY", "free")
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
