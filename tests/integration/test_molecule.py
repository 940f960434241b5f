"""Every role's molecule scenario (check, converge, idempotence, verify) through the harness."""
from __future__ import annotations

import os

import pytest

from gpuboot_lab.molecule import PARALLEL, ScenarioRunner, roles_with_scenarios

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="module")
def results(lab_required, tmp_path_factory):
    """Every scenario's result, run two at a time (ha_endpoint alone, after the others). .ci/run
    sets GPUBOOT_MOLECULE_PARALLEL=1 when another lane builds clusters beside this one: three
    labs at once on two cores starve the kubeadm clusters' API servers."""
    parallel = os.environ.get("GPUBOOT_MOLECULE_PARALLEL", str(PARALLEL))
    if not parallel.isdigit() or int(parallel) < 1:
        pytest.fail(f"GPUBOOT_MOLECULE_PARALLEL={parallel!r}: a number of scenarios, at least 1")
    with ScenarioRunner(tmp_path_factory.mktemp("molecule"), log=lambda m: None) as scenarios:
        yield scenarios.run_all(roles_with_scenarios(), parallel=int(parallel))


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
