from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):
    """Each test keeps gpuboot state in its own directory."""
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(tmp_path / "state"))
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item (rep_setup, rep_call), for fixtures that act on
    the outcome (tests/support/reuse.py)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
