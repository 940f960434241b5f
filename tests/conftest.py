from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.reuse import ReusePlugin

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    # Records a reused lab module's pass only when the whole module passed (tests/support/reuse.py).
    config.pluginmanager.register(ReusePlugin(), "gpuboot-reuse")


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):
    """Each test keeps gpuboot state in its own directory."""
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(tmp_path / "state"))
    yield
