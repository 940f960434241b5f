"""Every role's molecule scenario (check, converge, idempotence, verify) through the harness."""
from __future__ import annotations

import pytest

from gpuboot.lab.molecule import roles_with_scenarios, run_scenarios

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
