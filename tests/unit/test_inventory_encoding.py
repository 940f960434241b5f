"""An inventory, INI or YAML, or a group_vars/host_vars file that is not UTF-8 is one located
problem with the fix, before Ansible reads anything (Ansible would escape the bytes with a
warning, or fail inside its vars plugin)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuboot.cli.main import run

FORMS = Path(__file__).resolve().parents[1] / "corpus" / "forms"
LATIN1_E = b"\xe9"


def _latin1(text: bytes, after: bytes) -> bytes:
    """`text` with a Latin-1 é written after the first `after`."""
    at = text.index(after) + len(after)
    return text[:at] + LATIN1_E + text[at:]


@pytest.mark.parametrize("case", ["yaml inventory", "ini inventory", "group_vars file"])
def test_text_that_is_not_utf8_is_one_located_problem(tmp_path, capsys, case):
    if case == "yaml inventory":
        bad = tmp_path / "inventory.yml"
        bad.write_bytes(_latin1((FORMS / "yaml" / "inventory.yml").read_bytes(), b"cluster_name: forms"))
        inventory = bad
    elif case == "ini inventory":
        bad = inventory = tmp_path / "inventory.ini"
        bad.write_bytes(b"[control_plane]\ncp[01:03] rack=r" + LATIN1_E + b"\n")
    else:
        inventory = tmp_path / "inventory.yml"
        inventory.write_bytes((FORMS / "yaml" / "inventory.yml").read_bytes())
        bad = tmp_path / "group_vars" / "gpu_workers.yml"
        bad.parent.mkdir()
        bad.write_bytes(b"# rack\nrack: r" + LATIN1_E + b"\n")
    line = bad.read_bytes()[:bad.read_bytes().index(LATIN1_E)].count(b"\n") + 1

    assert run(["validate", str(inventory)]) == 2
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err and "WARNING" not in said.out + said.err
    assert "(1 problem)" in said.err
    assert f"{bad}:{line}: not UTF-8 text" in said.err and "save the file as UTF-8" in said.err
