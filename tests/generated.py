"""The files generated from the phase catalog and the roles:
- playbooks/up.yml, every phase of `gpuboot up` in catalog order, for plain `ansible-playbook`;
- playbooks/group_vars/all/roles.yml, what gpuboot feeds each role (each role's inputs.yml);
- docs/phases.md's tables of phases.
Tests fail when a generated file and its sources disagree; this writes them again:

    .venv/bin/python -m tests.generated
"""
from __future__ import annotations

from pathlib import Path

import yaml

from gpuboot.phases import catalog

ROOT = Path(__file__).resolve().parents[1]
UP_PLAYBOOK = ROOT / "playbooks" / "up.yml"
ROLE_INPUTS = ROOT / "playbooks" / "group_vars" / "all" / "roles.yml"
PHASES_DOC = ROOT / "docs" / "phases.md"
DOC_BEGIN, DOC_END = "<!-- generated from the phase catalog: begin -->", "<!-- generated from the phase catalog: end -->"
UP_HEADER = ("# Every phase of `gpuboot up`, in order, for plain `ansible-playbook -i INVENTORY playbooks/up.yml`.\n"
             "# Generated from bootstrap/gpuboot/phases/catalog.py: .venv/bin/python -m tests.generated\n")
INPUTS_HEADER = """\
# What gpuboot feeds each role from its settings, collected from roles/<role>/inputs.yml.
# Generated: edit a role's inputs.yml, then .venv/bin/python -m tests.generated
# The phase playbooks and `gpuboot render` (which reads them through Ansible) both use them.
# Ansible ranks these above role defaults and above the inventory file's group vars, and below
# host vars and inventory group_vars/<group> files: override a role input for some nodes there.
"""


def up_playbook() -> str:
    entries = [{"name": f"Import {phase.name}", "ansible.builtin.import_playbook": phase.playbook} for phase in catalog.UP]
    return UP_HEADER + yaml.safe_dump(entries, sort_keys=False)


# Each roles/<role>/inputs.yml opens with this.
INPUTS_FILE_HEADER = """\
# What gpuboot feeds this role, from its validated settings (gpuboot_settings, gpuboot_nodes,
# gpuboot_release and the facts in playbooks/group_vars/all/settings.yml). Collected into
# playbooks/group_vars/all/roles.yml, which is generated: .venv/bin/python -m tests.generated

"""


def role_inputs_files() -> list[Path]:
    return sorted((ROOT / "roles").glob("*/inputs.yml"))


def role_inputs() -> str:
    """Each role's inputs.yml without its header, under the role's name."""
    parts = [INPUTS_HEADER]
    for path in role_inputs_files():
        text = path.read_text()
        if not text.startswith(INPUTS_FILE_HEADER):
            raise ValueError(f"{path.relative_to(ROOT)} does not open with the header every inputs.yml has "
                             f"(tests/generated.py INPUTS_FILE_HEADER)")
        parts.append(f"\n# roles/{path.parent.name}\n" + text.removeprefix(INPUTS_FILE_HEADER))
    return "".join(parts)


def _what(phase: catalog.Phase) -> str:
    if callable(phase.result):
        return "depends on the settings: " + " ".join((phase.result.__doc__ or "").split())
    found = phase.result
    parts = [f"`{p}`" for p in (*found.files, *found.present)]
    parts += [f"{s} active" for s in found.services]
    parts += [f"CIS modes ({', '.join(found.cis_modes)})"] if found.cis_modes else []
    if phase.gate:
        return "nothing: the gate runs on every run that reaches it"
    if phase.read_only:
        return "nothing: read-only, runs when a later phase does"
    return ", ".join(parts) or "nothing recorded"


def phases_table(phases: tuple[catalog.Phase, ...]) -> str:
    rows = ["| # | phase | what | playbook | hosts | pulls from the mirror | leaves on its hosts |",
            "|---|---|---|---|---|---|---|"]
    for index, phase in enumerate(phases, 1):
        pulls = ", ".join([*phase.pulls, *(["packages"] if phase.installs_packages else [])])
        rows.append(f"| {index} | `{phase.name}` | {phase.title} | `playbooks/{phase.playbook}` | `{phase.hosts}` "
                    f"| {pulls or '-'} | {_what(phase)} |")
    return "\n".join(rows)


def phases_section() -> str:
    return (f"{DOC_BEGIN}\n\n## `gpuboot up`, in order\n\n{phases_table(catalog.UP)}\n\n"
            f"## `gpuboot upgrade`, in order\n\n{phases_table(catalog.UPGRADE)}\n\n{DOC_END}")


def phases_doc() -> str:
    """docs/phases.md with its generated section made again (the prose around it is kept)."""
    text = PHASES_DOC.read_text()
    if DOC_BEGIN not in text or DOC_END not in text:
        raise ValueError(f"{PHASES_DOC.relative_to(ROOT)} lost its generated section's markers")
    return text[:text.index(DOC_BEGIN)] + phases_section() + text[text.index(DOC_END) + len(DOC_END):]


GENERATED = {UP_PLAYBOOK: up_playbook, ROLE_INPUTS: role_inputs, PHASES_DOC: phases_doc}


if __name__ == "__main__":
    for path, make in GENERATED.items():
        path.write_text(make())
        print(f"wrote {path.relative_to(ROOT)}")
