"""Reuse, on this machine, the pass of a slow lab test whose inputs did not change: the same
rule as the molecule scenarios' (gpuboot_lab.molecule). A record under
~/.cache/gpuboot/test-passes names the test and a digest of every file it depends on; while
the record exists the test is skipped, saying so and where the record is. Any change to
those files runs it again; GPUBOOT_TESTS_FRESH=1 runs it regardless."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuboot" / "test-passes"
FRESH_ENV = "GPUBOOT_TESTS_FRESH"
# Everything a lab test of the product can depend on: any change here runs it again.
PRODUCT = ("bootstrap", "playbooks", "roles", "mirror", "pyproject.toml", "tests/doubles", "tests/support",
           "tests/integration/conftest.py")


def digest(paths: tuple[str, ...]) -> str:
    """Every file under the given repository paths, by name and content."""
    hashed = hashlib.sha256()
    for part in sorted(paths):
        base = ROOT / part
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for file in files:
            if "__pycache__" in file.parts:
                continue
            hashed.update(str(file.relative_to(ROOT)).encode())
            hashed.update(file.read_bytes())
    return hashed.hexdigest()[:24]


def reuse_or_run(request: pytest.FixtureRequest, paths: tuple[str, ...]):
    """Skip the requesting test if it passed before with these inputs; else run it and, if it
    passes, record that (a generator for a fixture: `yield from reuse_or_run(...)`)."""
    record = CACHE / f"{request.node.name}-{digest(paths)}.passed"
    if record.is_file() and os.environ.get(FRESH_ENV) != "1":
        pytest.skip(f"passed on this machine with identical inputs at {record.read_text().strip()} "
                    f"({record}); {FRESH_ENV}=1 runs it again")
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.passed:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
