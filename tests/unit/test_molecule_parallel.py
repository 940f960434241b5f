"""`gpuboot lab molecule` runs scenarios a few at a time: the reused are answered from their
records without starting anything, the lab is prepared once before the workers start, no more
than `parallel` run at once, and ha_endpoint (keepalived's VIP and VRRP on the shared network)
runs alone after the others. The scenarios themselves run in tests/integration/test_molecule.py."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpuboot_lab import molecule
from gpuboot_lab.errors import LabError
from gpuboot_lab.molecule import ScenarioResult, ScenarioRunner


class Recorded(ScenarioRunner):
    """The runner's scheduling with its scenarios and lab replaced by a log of what ran when."""

    def __init__(self, reused: set[str], fail: set[str] = frozenset()) -> None:
        self.log = lambda message: None
        self._reused, self._fail = reused, fail
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.events: list[tuple[str, str]] = []
        self.most = 0
        self.prepared = 0

    def prepare(self) -> dict[str, str]:
        with self.lock:
            self.prepared += 1
        return {}

    def reused(self, role: str) -> ScenarioResult | None:
        return ScenarioResult(role, True, 0.0, Path(f"/records/{role}.log"), cached=True) if role in self._reused else None

    def run(self, role: str) -> ScenarioResult:
        with self.lock:
            self.running.add(role)
            self.most = max(self.most, len(self.running))
            self.events.append(("start", role))
            others = set(self.running) - {role}
        if role in molecule.ALONE:
            assert not others, f"{role} ran beside {others}"
        time.sleep(0.05)
        with self.lock:
            self.running.discard(role)
            self.events.append(("end", role))
        return ScenarioResult(role, role not in self._fail, 0.05, Path(f"/logs/{role}.log"))


ROLES = ["containerd", "ha_endpoint", "kube_packages", "os_prep", "preflight", "registry_mirror"]


def test_at_most_parallel_at_once_and_the_alone_last():
    runner = Recorded(reused=set())
    results = runner.run_all(ROLES, parallel=2)
    assert list(results) == ROLES
    assert runner.most == 2
    assert runner.events[-2:] == [("start", "ha_endpoint"), ("end", "ha_endpoint")]
    assert runner.prepared == 1


def test_one_at_a_time_when_asked():
    runner = Recorded(reused=set())
    runner.run_all(ROLES, parallel=1)
    assert runner.most == 1


def test_reused_scenarios_are_not_run_and_nothing_starts_when_all_are():
    runner = Recorded(reused={"os_prep", "preflight"})
    results = runner.run_all(ROLES, parallel=2)
    assert {role for role, r in results.items() if r.cached} == {"os_prep", "preflight"}
    assert {role for _, role in runner.events} == set(ROLES) - {"os_prep", "preflight"}
    every = Recorded(reused=set(ROLES))
    assert all(r.cached for r in every.run_all(ROLES).values())
    assert every.prepared == 0 and every.events == []


def test_a_failure_is_reported_for_its_role_and_the_others_still_run():
    runner = Recorded(reused=set(), fail={"kube_packages"})
    results = runner.run_all(ROLES, parallel=2)
    assert [role for role, r in results.items() if not r.ok] == ["kube_packages"]
    assert {role for kind, role in runner.events if kind == "end"} == set(ROLES)


def test_no_scenario_at_a_time_is_refused():
    with pytest.raises(LabError, match="--parallel 0"):
        Recorded(reused=set()).run_all(ROLES, parallel=0)
