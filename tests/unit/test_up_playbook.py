"""playbooks/up.yml (every phase of `gpuboot up`, for plain `ansible-playbook`) is generated from
the phase catalog: this test fails when the two disagree, and names the command that writes it
again (.venv/bin/python -m tests.generated)."""
from __future__ import annotations

import yaml

from gpuboot.phases import catalog
from tests.generated import UP_PLAYBOOK, up_playbook


def test_up_playbook_is_generated_from_the_catalog():
    assert UP_PLAYBOOK.read_text() == up_playbook(), \
        "playbooks/up.yml differs from the catalog: run .venv/bin/python -m tests.generated"


def test_up_playbook_imports_every_phase_once_in_catalog_order():
    imports = [entry["ansible.builtin.import_playbook"] for entry in yaml.safe_load(UP_PLAYBOOK.read_text())]
    assert imports == [p.playbook for p in catalog.UP]
    assert len(set(imports)) == len(imports)
