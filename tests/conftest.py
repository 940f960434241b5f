from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):
    """Each test keeps gpuboot state in its own directory."""
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(tmp_path / "state"))
    yield
