"""The lab modules' pass reuse (tests/support/reuse.py), run on small inner pytest sessions:
a module is reused whole or not at all, its lab fixture is never set up when it is reused, and
a record is written only when setup, every test and teardown passed."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import reuse

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.support.reuse import ReusePlugin

def pytest_configure(config):
    config.pluginmanager.register(ReusePlugin(), "gpuboot-reuse")
"""

MODULE = """
import os
from pathlib import Path
import pytest
from tests.support.reuse import reuse_module

BUILT = Path(os.environ["INNER_BUILT"])

@pytest.fixture(scope="module")
def reused(request):
    yield from reuse_module(request)

@pytest.fixture(scope="module")
def lab(reused):
    BUILT.write_text(BUILT.read_text() + "built\\n" if BUILT.exists() else "built\\n")
    yield
    if os.environ.get("INNER_TEARDOWN_FAILS"):
        raise RuntimeError("teardown failed")

def test_first(lab):
    assert not os.environ.get("INNER_FIRST_FAILS")

def test_second(lab):
    pass
"""


@pytest.fixture
def inner(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(CONFTEST)
    (project / "test_inner_lab.py").write_text(textwrap.dedent(MODULE))
    cache = tmp_path / "cache"

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if k != reuse.FRESH_ENV}
        environ.update(XDG_CACHE_HOME=str(cache), INNER_BUILT=str(tmp_path / "built"),
                       PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "bootstrap")]), **env)
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
                              cwd=project, env=environ, capture_output=True, text=True, timeout=120)

    def records() -> list[Path]:
        return sorted((cache / "gpuboot" / "test-passes").glob("*.passed"))

    def builds() -> int:
        built = tmp_path / "built"
        return len(built.read_text().splitlines()) if built.exists() else 0

    return run, records, builds, project


def test_a_whole_passing_module_is_recorded_then_skipped_as_reused_without_its_lab(inner):
    run, records, builds, _ = inner
    first = run()
    assert first.returncode == 0, first.stdout
    assert "2 passed" in first.stdout
    assert len(records()) == 1 and builds() == 1
    second = run()
    assert second.returncode == 0, second.stdout
    assert "2 skipped" in second.stdout and "REUSED" in second.stdout
    assert str(records()[0]) in second.stdout
    assert builds() == 1  # the lab fixture was not set up again
    fresh = run(**{reuse.FRESH_ENV: "1"})
    assert "2 passed" in fresh.stdout and builds() == 2


def test_no_record_when_teardown_fails(inner):
    run, records, _, _ = inner
    proc = run(INNER_TEARDOWN_FAILS="1")
    assert "2 passed" in proc.stdout and "error" in proc.stdout
    assert records() == []


def test_no_record_when_one_test_fails_or_is_left_out(inner):
    run, records, _, _ = inner
    assert "1 failed" in run(INNER_FIRST_FAILS="1").stdout
    assert records() == []
    assert "1 passed" in run("-k", "second").stdout
    assert records() == []  # part of an ordered module is never recorded


def test_an_edit_to_the_module_or_a_variable_gpuboot_reads_runs_it_again(inner):
    run, records, builds, project = inner
    run()
    assert builds() == 1
    module = project / "test_inner_lab.py"
    module.write_text(module.read_text() + "\n# an edit\n")
    assert "2 passed" in run().stdout and builds() == 2
    assert "2 skipped" in run().stdout
    assert "2 passed" in run(GPUBOOT_SOMETHING="1").stdout and builds() == 3
    assert len(records()) == 3


def test_the_key_holds_the_harness_the_lock_and_the_machine():
    for path in ("ansible.cfg", "requirements.lock", "pyproject.toml", "bootstrap"):
        assert path in reuse.PRODUCT
    for path in ("tests/conftest.py", "tests/fixtures", "tests/doubles", "tests/support", "tests/integration/conftest.py"):
        assert path in reuse.HARNESS
    key = reuse.ModuleKey.now(Path(__file__), ("ansible.cfg",))
    assert {"python", "go", "host", "env"} <= set(key.parts)
    assert any(p.startswith("ansible-core==") for p in key.parts["python"])


def test_the_variables_that_only_place_the_tests_stay_out_of_the_key(monkeypatch):
    # .ci/record runs with its clone's folder in GPUBOOT_RECORD_CLONE and CI without: a record
    # keyed on it would never be CI's. A variable gpuboot reads is in the key.
    from gpuboot_lab import fingerprint
    for name in ("GPUBOOT_RECORD_CLONE", "GPUBOOT_TEST_LANES", "GPUBOOT_TEST_LANE", "GPUBOOT_MOLECULE_PARALLEL"):
        monkeypatch.setenv(name, "/tmp/somewhere")
        assert name not in fingerprint.environment(), name
    monkeypatch.setenv("GPUBOOT_STATE_DIRX", "1")
    monkeypatch.setenv("ANSIBLE_FORKS", "7")
    assert {"GPUBOOT_STATE_DIRX", "ANSIBLE_FORKS"} <= set(fingerprint.environment())


def test_a_role_is_keyed_but_not_its_molecule_scenario(tmp_path):
    tasks = tmp_path / "roles" / "calico" / "tasks" / "main.yml"
    verify = tmp_path / "roles" / "calico" / "molecule" / "default" / "verify.yml"
    for file in (tasks, verify):
        file.parent.mkdir(parents=True)
        file.write_text("- name: x\n")
    before = reuse.digest(("roles",), tmp_path)
    verify.write_text("- name: y\n")
    assert reuse.digest(("roles",), tmp_path) == before  # molecule keys its scenarios itself
    tasks.write_text("- name: y\n")
    assert reuse.digest(("roles",), tmp_path) != before
