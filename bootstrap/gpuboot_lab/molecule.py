"""Runs every role's molecule scenario, one after another, on a fenced lab network with
the apt cache on its gateway, and summarises the results."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpuboot import content
from gpuboot_lab.cluster import Lab, LabSpec
from gpuboot_lab.errors import LabError
from gpuboot_lab.image import ensure_image
from gpuboot_lab.podman import write_containers_conf

NAME = "molecule"
SUBNET = "10.213.200.0/24"


CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuboot" / "molecule"
# GPUBOOT_MOLECULE_FRESH=1 runs every scenario even when its inputs passed before.
FRESH_ENV = "GPUBOOT_MOLECULE_FRESH"


@dataclass(frozen=True)
class ScenarioResult:
    role: str
    ok: bool
    seconds: float
    log: Path
    cached: bool = False


# A path under tests/ that a scenario's files name (a double it copies in, a helper it runs).
_TEST_PATH = re.compile(r"tests/(?:doubles|support)/[\w.-]+(?:/[\w.-]+)*")


def _test_parts(root: Path, role: str) -> list[Path]:
    """The test doubles and helpers the role's scenario names: a double's whole folder (it may
    import its neighbours), a helper file alone. Another role's double is not this one's input."""
    named: set[Path] = set()
    for file in sorted((root / "roles" / role / "molecule").rglob("*")):
        if file.is_file():
            for match in _TEST_PATH.findall(file.read_text(errors="replace")):
                path = root / match
                if match.startswith("tests/doubles/"):
                    path = root / "/".join(match.split("/")[:3])
                named.add(path)
    return sorted(named)


def scenario_key(role: str, image: str) -> str:
    """Everything a scenario's outcome depends on: the role with its scenario, the test
    doubles and helpers that scenario names, the node image, and the pinned tool versions."""
    root = content.content_dir()
    digest = hashlib.sha256(f"{role}|{image}".encode())
    parts = [root / "roles" / role, *_test_parts(root, role), root / "pyproject.toml", Path(__file__)]
    for part in parts:
        if not part.exists():
            continue
        files = [part] if part.is_file() else sorted(p for p in part.rglob("*") if p.is_file())
        for file in files:
            if "__pycache__" in file.parts:
                continue
            digest.update(str(file.relative_to(part.parent)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:24]


def roles_with_scenarios(only: tuple[str, ...] = ()) -> list[str]:
    roles = sorted(p.parents[2].name for p in (content.content_dir() / "roles").glob("*/molecule/default/molecule.yml"))
    unknown = set(only) - set(roles)
    if unknown:
        raise LabError(f"no molecule scenario for: {', '.join(sorted(unknown))}",
                       hint=f"roles with scenarios: {', '.join(roles)}")
    return [r for r in roles if not only or r in only]


def run_scenarios(state_dir: Path, only: tuple[str, ...] = (), log=print, keep: bool = False) -> list[ScenarioResult]:
    roles = roles_with_scenarios(only)
    lab = Lab(state_dir / "_lab" / NAME, log=log)
    if lab.load() is None:
        # A one-node lab gives the scenarios a fenced network with the apt cache on its gateway.
        lab.up(LabSpec(name=NAME, control_planes=1, workers=0, gpu_workers=0, subnet=SUBNET),
               lab.dir / "inventory.yml")
    image = ensure_image(lab.podman, lab.cache_dir, log)
    env = dict(os.environ,
               GPUBOOT_MOLECULE_NETWORK=f"gpuboot-{NAME}",
               GPUBOOT_NODE_IMAGE=image,
               CONTAINERS_CONF=str(write_containers_conf(lab.cache_dir)),
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    results = []
    fresh = os.environ.get(FRESH_ENV) == "1"
    try:
        for role in roles:
            role_dir = content.content_dir() / "roles" / role
            logfile = lab.dir / f"molecule-{role}.log"
            passed = CACHE / f"{role}-{scenario_key(role, image)}.log"
            if passed.is_file() and not fresh:
                # The same inputs passed before on this machine: reuse that result.
                log(f"molecule test: {role} passed before with identical inputs ({passed})")
                results.append(ScenarioResult(role, True, 0.0, passed, cached=True))
                continue
            log(f"molecule test: {role} (log {logfile})")
            t0 = time.monotonic()
            with logfile.open("w") as out:
                proc = subprocess.run(["molecule", "test"], cwd=role_dir, stdout=out, stderr=subprocess.STDOUT,
                                      env={**env, "GPUBOOT_MOLECULE_PREFIX": f"mol-{role.replace('_', '-')}"})
            results.append(ScenarioResult(role, proc.returncode == 0, round(time.monotonic() - t0, 1), logfile))
            if proc.returncode == 0:
                passed.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(logfile, passed)
            log(f"  {'ok' if proc.returncode == 0 else 'FAILED'} {role} in {results[-1].seconds}s")
    finally:
        if not keep:
            lab.down(NAME)
    return results
