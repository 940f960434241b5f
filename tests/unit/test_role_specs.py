"""Each role's `meta/argument_specs.yml` and `defaults/main.yml` say the same thing. Ansible
does not apply a spec's `default` (the spec only documents and validates), so a spec default
that differs from defaults/main.yml, or has none there, tells a reader a value the role never
gets; and a `required` option with a default in defaults/main.yml is always satisfied, so the
check that gpuboot fed it can never fail."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.parent for p in ROOT.glob("roles/*/meta/argument_specs.yml"))


def options(role: Path) -> dict[str, dict]:
    """Every option of every entry point (main, and those a playbook reaches with tasks_from)."""
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    found: dict[str, dict] = {}
    for entry in specs.values():
        for name, option in (entry.get("options") or {}).items():
            found.setdefault(name, option)
    return found


def defaults(role: Path) -> dict:
    path = role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def disagreements(role: Path) -> list[str]:
    declared, given = options(role), defaults(role)
    found = []
    for name, option in declared.items():
        if option.get("required") and name in given:
            found.append(f"{name} is required but defaults/main.yml gives it {given[name]!r}")
        elif "default" in option and name not in given:
            found.append(f"{name}'s spec default {option['default']!r} is not in defaults/main.yml")
        elif "default" in option and option["default"] != given[name]:
            found.append(f"{name}: spec default {option['default']!r}, defaults/main.yml {given[name]!r}")
    found += [f"{name} is in defaults/main.yml but no entry point declares it" for name in given if name not in declared]
    return found


def test_every_role_has_a_spec():
    assert {p.name for p in ROLES} == {p.name for p in (ROOT / "roles").iterdir() if p.is_dir()}


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_spec_and_defaults_agree(role: Path):
    assert disagreements(role) == [], f"roles/{role.name}: fix meta/argument_specs.yml or defaults/main.yml"


def test_the_check_sees_each_kind_of_drift(tmp_path):
    role = tmp_path / "r"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(yaml.safe_dump({"argument_specs": {"main": {"options": {
        "r_a": {"type": "str", "required": True}, "r_b": {"type": "int", "default": 1},
        "r_c": {"type": "dict", "default": {}}, "r_d": {"type": "str", "default": "x"}}}}}))
    (role / "defaults" / "main.yml").write_text(yaml.safe_dump({"r_a": "", "r_b": 1, "r_c": {"k": 1}, "r_e": 2}))
    found = disagreements(role)
    assert len(found) == 4 and all(any(n in line for line in found) for n in ("r_a", "r_c", "r_d", "r_e")), found


def fed_by_gpuboot() -> set[str]:
    """Every variable playbooks/group_vars sets: what gpuboot feeds the roles from its model."""
    found: set[str] = set()
    for path in (ROOT / "playbooks" / "group_vars").rglob("*.yml"):
        found |= set(yaml.safe_load(path.read_text()) or {})
    return found


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_what_gpuboot_feeds_a_role_is_required_and_has_no_literal_default(role: Path):
    """A role default beside gpuboot's value restates the model (a subnet, a port, the pause
    image) and drifts from it unseen; so what gpuboot feeds is required in the spec, with no
    default in the role, and molecule's scenario gives it as gpuboot's group_vars would."""
    fed = fed_by_gpuboot()
    declared, given = options(role), defaults(role)
    restated = sorted(name for name in declared if name in fed and (name in given or not declared[name].get("required")))
    assert restated == [], f"roles/{role.name}: gpuboot feeds these; make them required and drop their defaults"
