"""requirements.lock: every dependency of pyproject.toml pinned to a version its range allows,
every pin hashed, and the environment running the tests installed exactly from it.
bootstrap/lock.sh moves the lock (docs/lab.md)."""
from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) from the lock's `name==version \\ --hash=...` entries."""
    entries: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text()):
        match = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)", block)
        if match:
            entries[canonicalize_name(match[1])] = (match[2], re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return entries


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = [*project["project"]["dependencies"], *project["project"]["optional-dependencies"]["test"],
             *project["build-system"]["requires"]]
    return [Requirement(r) for r in names]


def test_every_declared_dependency_is_locked_at_a_version_its_range_allows():
    pins = locked()
    wrong = {}
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        if name not in pins:
            wrong[requirement.name] = "not in the lock"
        elif not requirement.specifier.contains(pins[name][0], prereleases=True):
            wrong[requirement.name] = f"locked {pins[name][0]}, pyproject.toml asks {requirement.specifier}"
    assert not wrong, f"requirements.lock does not match pyproject.toml (run bash bootstrap/lock.sh): {wrong}"


def test_every_pin_carries_its_hashes():
    unhashed = [name for name, (_, hashes) in locked().items() if not hashes]
    assert len(locked()) > 40
    assert not unhashed


def test_the_running_environment_is_the_locked_one():
    """The tests run in what setup installed from the lock, not in a hand-made environment."""
    differ = {}
    for name, (version, _) in locked().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = "missing"
        if installed != version:
            differ[name] = f"locked {version}, installed {installed}"
    assert not differ, f"{differ}; bash bootstrap/setup.sh reinstalls .venv from requirements.lock"
