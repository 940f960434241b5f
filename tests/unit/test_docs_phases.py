"""docs/phases.md's tables are generated from the phase catalog (bootstrap/gpuboot/phases/catalog.py):
this test fails when the two disagree, and names the command that writes them again
(.venv/bin/python -m tests.generated)."""
from __future__ import annotations

from tests.generated import PHASES_DOC, phases_doc


def test_docs_phases_match_the_catalog():
    assert PHASES_DOC.read_text() == phases_doc(), \
        "docs/phases.md differs from the catalog: run .venv/bin/python -m tests.generated"
