"""Reuse, on this machine, the pass of a slow lab module whose inputs did not change.

A module opts in with a module-scoped fixture that its lab fixture depends on:

    @pytest.fixture(scope="module")
    def reused(request):
        yield from reuse_module(request, "tests/integration/test_lab_x.py")

The unit is the whole module, never some of its tests: the day-2 tests each start from the
state the one before left. Its key is every repository file a lab test can depend on (PRODUCT
and HARNESS, plus the module's own), and this machine's fingerprint (gpuboot_lab.fingerprint:
installed Python packages, Go, the host's Debian packages, the node image's contents, the
GPUBOOT_/ANSIBLE_ variables). While a record for that key exists under
~/.cache/gpuboot/test-passes, every test of the module is skipped as REUSED, naming the record,
and its lab is never built. A record is written only when every test of the module ran in the
session (none deselected) and its setup, call and teardown all passed.
GPUBOOT_TESTS_FRESH=1 runs it regardless."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuboot_lab import fingerprint
from gpuboot_lab.cluster import DEFAULT_CACHE
from gpuboot_lab.fingerprint import hash_files
from gpuboot_lab.image import image_tarball

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuboot" / "test-passes"
FRESH_ENV = "GPUBOOT_TESTS_FRESH"
# Everything a lab test of the product can depend on: any change here runs it again.
PRODUCT = ("bootstrap", "playbooks", "roles", "mirror", "pyproject.toml", "requirements.lock", "ansible.cfg")
# The harness around every lab test: fixtures, doubles, helpers and the pass/fail hook.
HARNESS = ("tests/conftest.py", "tests/integration/conftest.py", "tests/doubles", "tests/support", "tests/fixtures")


def digest(paths: tuple[str, ...], root: Path = ROOT) -> str:
    """Every file under the given repository paths, by name and content, less the roles'
    molecule scenarios: no lab module runs them (each scenario is keyed on its own, by
    gpuboot_lab.molecule), so mending one must not void the lab's records."""
    hashed = hashlib.sha256()
    hash_files(hashed, [part for name in sorted(set(paths)) for part in _keyed(root / name)], lambda part: root)
    return hashed.hexdigest()[:24]


def _keyed(path: Path) -> list[Path]:
    if path.name != "roles" or not path.is_dir():
        return [path]
    return sorted(child for role in path.iterdir() if role.is_dir()
                  for child in role.iterdir() if child.name != "molecule")


def _node_image() -> Path | None:
    tarball = image_tarball(DEFAULT_CACHE)
    return tarball if tarball.is_file() else None


@dataclass
class ModuleKey:
    """A module's key: its files' digest, fixed when the module starts (an edit made while it
    runs must not be recorded as passed), and this machine's fingerprint."""
    module: str
    files: str
    machine: str = ""
    parts: dict = field(default_factory=dict)

    @classmethod
    def now(cls, module: Path, paths: tuple[str, ...]) -> ModuleKey:
        files = hashlib.sha256(digest(paths).encode() + module.read_bytes()).hexdigest()[:24]
        key = cls(module.stem, files)
        key.refresh_machine()
        return key

    def refresh_machine(self) -> None:
        # The node image may be built by the run itself; it is then keyed as built.
        self.parts = fingerprint.fingerprint(_node_image())
        self.machine = hashlib.sha256(json.dumps(self.parts, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def record(self) -> Path:
        return CACHE / f"{self.module}-{self.files}-{self.machine}.passed"


def _commit() -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


class ReusePlugin:
    """Follows each opted-in module's reports and writes its record when the whole module passed."""

    def __init__(self) -> None:
        self.pending: dict[str, ModuleKey] = {}  # module file path -> key
        self.items: dict[str, list[str]] = {}     # module file path -> its test ids in this session
        self.deselected: set[str] = set()
        self.failed: set[str] = set()
        self.passed: dict[str, set[str]] = {}

    @staticmethod
    def _module(nodeid: str) -> str:
        return nodeid.split("::", 1)[0]

    def pytest_deselected(self, items) -> None:
        self.deselected.update(self._module(item.nodeid) for item in items)

    def pytest_collection_finish(self, session) -> None:
        for item in session.items:
            self.items.setdefault(self._module(item.nodeid), []).append(item.nodeid)

    def pytest_runtest_logreport(self, report) -> None:
        module = self._module(report.nodeid)
        if report.failed or (report.skipped and report.when != "teardown"):
            self.failed.add(module)
        elif report.when == "teardown":
            self.passed.setdefault(module, set()).add(report.nodeid)
            if report.nodeid == self.items.get(module, [None])[-1]:
                self._finish(module)

    def _finish(self, module: str) -> None:
        key = self.pending.pop(module, None)
        if key is None or module in self.failed or module in self.deselected:
            return
        if self.passed.get(module) != set(self.items[module]):
            return
        if key.machine and "node_image" not in key.parts:
            key.refresh_machine()
        key.record.parent.mkdir(parents=True, exist_ok=True)
        key.record.write_text(json.dumps({"passed": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": _commit(),
                                          "tests": sorted(self.items[module]), "machine": key.parts}, indent=1) + "\n")


def recorded_pass(key: ModuleKey) -> Path | None:
    """The record a module with this key is reused on here and now: none with FRESH_ENV=1."""
    return key.record if key.record.is_file() and os.environ.get(FRESH_ENV) != "1" else None


def reuse_module(request: pytest.FixtureRequest, *paths: str):
    """For a module-scoped fixture: skip the whole module as REUSED if it passed on this machine
    with identical inputs; else let it run, and record it if every test of it passes."""
    module = ReusePlugin._module(request.node.nodeid)
    key = ModuleKey.now(request.node.path, (*PRODUCT, *HARNESS, *paths))
    record = recorded_pass(key)
    if record is not None:
        stored = json.loads(record.read_text())
        pytest.skip(f"REUSED: the whole module passed on this machine at {stored['passed']} (commit "
                    f"{stored['commit']}) with identical inputs; record {record}; {FRESH_ENV}=1 runs it")
    plugin = request.config.pluginmanager.get_plugin("gpuboot-reuse")
    plugin.pending[module] = key
    yield
