"""What gpuboot feeds a role lives with the role (roles/<role>/inputs.yml), and
playbooks/group_vars/all/roles.yml, where Ansible reads them, is generated from those files:
a phase's facts are its role, its playbook and its catalog entry."""
from __future__ import annotations

import pytest
import yaml

from tests.generated import INPUTS_FILE_HEADER, ROLE_INPUTS, ROOT, role_inputs, role_inputs_files

INPUTS = role_inputs_files()


def test_roles_yml_is_generated_from_the_roles_inputs():
    assert ROLE_INPUTS.read_text() == role_inputs(), \
        "playbooks/group_vars/all/roles.yml differs from roles/*/inputs.yml: run .venv/bin/python -m tests.generated"


def test_every_input_is_set_once():
    seen: dict[str, str] = {}
    for path in INPUTS:
        for name in yaml.safe_load(path.read_text()) or {}:
            assert name not in seen, f"{name} is set in {seen[name]} and in {path.parent.name}'s inputs"
            seen[name] = path.parent.name
    assert len(seen) == len(yaml.safe_load(ROLE_INPUTS.read_text()))


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.parent.name)
def test_a_role_s_inputs_are_its_own_declared_options(path):
    role = path.parent.name
    assert path.read_text().startswith(INPUTS_FILE_HEADER), f"roles/{role}/inputs.yml: open it with the header"
    inputs = yaml.safe_load(path.read_text()) or {}
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    declared = {name for entry in spec["argument_specs"].values() for name in entry.get("options") or {}}
    foreign = sorted(name for name in inputs if not name.startswith(f"{role}_"))
    undeclared = sorted(name for name in inputs if name not in declared)
    assert foreign == [], f"roles/{role}/inputs.yml sets other roles' variables: {foreign}"
    assert undeclared == [], f"roles/{role}/inputs.yml sets what its argument spec does not declare: {undeclared}"


def test_the_check_sees_inputs_out_of_step(tmp_path, monkeypatch):
    import tests.generated as generated
    role = tmp_path / "roles" / "demo"
    role.mkdir(parents=True)
    (role / "inputs.yml").write_text(INPUTS_FILE_HEADER + 'demo_port: "{{ gpuboot_settings.control_plane.port }}"\n')
    monkeypatch.setattr(generated, "ROOT", tmp_path)
    assert 'demo_port: "{{ gpuboot_settings.control_plane.port }}"' in generated.role_inputs()
    (role / "inputs.yml").write_text('demo_port: 1\n')
    with pytest.raises(ValueError, match="roles/demo/inputs.yml does not open with the header"):
        generated.role_inputs()
