"""playbooks/up.yml (every phase of `gpuboot up`, for plain `ansible-playbook`) is generated from
the phase catalog: this test fails when the two disagree, and prints the command that writes it
again:

    .venv/bin/python -m tests.unit.test_up_playbook
"""
from __future__ import annotations

from pathlib import Path

import yaml

from gpuboot.phases import catalog

PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "up.yml"
HEADER = ("# Every phase of `gpuboot up`, in order, for plain `ansible-playbook -i INVENTORY playbooks/up.yml`.\n"
          "# Generated from bootstrap/gpuboot/phases/catalog.py: .venv/bin/python -m tests.unit.test_up_playbook\n")


def generated() -> str:
    entries = [{"name": f"Import {phase.name}", "ansible.builtin.import_playbook": phase.playbook} for phase in catalog.UP]
    return HEADER + yaml.safe_dump(entries, sort_keys=False)


def test_up_playbook_is_generated_from_the_catalog():
    assert PLAYBOOK.read_text() == generated(), \
        "playbooks/up.yml differs from the catalog: run .venv/bin/python -m tests.unit.test_up_playbook"


def test_up_playbook_imports_every_phase_once_in_catalog_order():
    imports = [entry["ansible.builtin.import_playbook"] for entry in yaml.safe_load(PLAYBOOK.read_text())]
    assert imports == [p.playbook for p in catalog.UP]
    assert len(set(imports)) == len(imports)


if __name__ == "__main__":
    PLAYBOOK.write_text(generated())
    print(f"wrote {PLAYBOOK}")
