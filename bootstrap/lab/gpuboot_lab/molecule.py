"""Runs every role's molecule scenario on a fenced lab network with the apt cache on its
gateway, a few at a time, and summarises the results."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpuboot import content
from gpuboot_lab import LAB_RELEASE, artifacts, kubernetes
from gpuboot_lab.cluster import Lab, LabSpec
from gpuboot_lab.errors import LabError
from gpuboot_lab.fingerprint import fingerprint_digest, hash_files, node_image_contents
from gpuboot_lab.image import ensure_image, image_reference, image_tarball
from gpuboot_lab.podman import write_containers_conf

NAME = "molecule"
SUBNET = "10.213.200.0/24"


CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuboot" / "molecule"
LOGS = CACHE / "logs"
# GPUBOOT_MOLECULE_FRESH=1 runs every scenario even when its inputs passed before.
FRESH_ENV = "GPUBOOT_MOLECULE_FRESH"
# Scenarios at once. Each is one node whose converge waits on apt, systemd and the network as
# much as on the CPU: two share a 2-core machine well, more only queue for it.
PARALLEL = 2
# Scenarios that run after the others, on their own: ha_endpoint's keepalived claims a VIP on the
# shared lab network and sends VRRP there, which another scenario's node would see.
ALONE = frozenset({"ha_endpoint"})


@dataclass(frozen=True)
class ScenarioResult:
    role: str
    ok: bool
    seconds: float
    log: Path
    # Reused: the same inputs passed before on this machine; `log` is that pass's log.
    cached: bool = False


# A path that a scenario's files name: a test double it copies in, a helper it runs, a release
# file of the matrix it reads.
_NAMED_PATH = re.compile(r"(?:tests/(?:doubles|support)|mirror/releases)/[\w.-]+(?:/[\w.-]+)*")
# A task calling one of gpuboot's modules (`gpuboot_packages:`), and a module's import of
# gpuboot's module_utils.
_MODULE_CALL = re.compile(r"^[\s-]*(gpuboot_\w+):\s*$", re.MULTILINE)
_UTILS_IMPORT = re.compile(r"ansible\.module_utils\.(gpuboot_\w+)")


def _named_parts(root: Path, role: str) -> list[Path]:
    """The test doubles, helpers and release files the role's scenario names: a double's whole
    folder (it may import its neighbours), a helper or release file alone. Another role's
    double is not this one's input."""
    named: set[Path] = set()
    for file in sorted((root / "roles" / role / "molecule").rglob("*")):
        if file.is_file():
            for match in _NAMED_PATH.findall(file.read_text(errors="replace")):
                path = root / match
                if match.startswith("tests/doubles/"):
                    path = root / "/".join(match.split("/")[:3])
                named.add(path)
    return sorted(named)


def _module_parts(root: Path, role: str) -> list[Path]:
    """gpuboot's modules the role's tasks and scenario call, with the module_utils they import
    (and those import): another module is not this role's input."""
    library, utils = root / "playbooks" / "library", root / "playbooks" / "module_utils"
    pending = [library / f"{name}.py" for file in sorted((root / "roles" / role).rglob("*.yml"))
               for name in _MODULE_CALL.findall(file.read_text(errors="replace"))]
    found: set[Path] = set()
    while pending:
        part = pending.pop()
        if part in found or not part.is_file():
            continue  # a variable named gpuboot_*, not a module
        found.add(part)
        pending += [utils / f"{name}.py" for name in _UTILS_IMPORT.findall(part.read_text(errors="replace"))]
    return sorted(found)


def scenario_key(role: str, image: str) -> str:
    """Everything a scenario's outcome depends on: the role with its scenario, the shared
    molecule config (driver, platforms, test sequence), the doubles, helpers and release files
    the scenario names, gpuboot's modules the role calls, the node image, how the lab builds the
    containerd.io it offers, the lock and this machine's installed tools (gpuboot_lab.fingerprint)."""
    root = content.content_dir()
    digest = hashlib.sha256(f"{role}|{image}|{LAB_RELEASE}|{fingerprint_digest()}".encode())
    parts = [root / "roles" / role, *_named_parts(root, role), *_module_parts(root, role),
             root / ".config" / "molecule" / "config.yml",
             root / "pyproject.toml", root / "requirements.lock", Path(__file__), Path(artifacts.__file__),
             Path(kubernetes.__file__), root / "mirror" / "releases" / f"{LAB_RELEASE}.yml"]
    hash_files(digest, parts, lambda part: part.parent)
    return digest.hexdigest()[:24]


def roles_with_scenarios(only: tuple[str, ...] = ()) -> list[str]:
    roles = sorted(p.parents[2].name for p in (content.content_dir() / "roles").glob("*/molecule/default/molecule.yml"))
    unknown = set(only) - set(roles)
    if unknown:
        raise LabError(f"no molecule scenario for: {', '.join(sorted(unknown))}",
                       hint=f"roles with scenarios: {', '.join(roles)}")
    return [r for r in roles if not only or r in only]


class ScenarioRunner:
    """Runs roles' scenarios on a fenced one-node lab network, started on the first scenario
    that is not reused (a run that reuses them all starts nothing). Each scenario has its own
    containers (named by its role) and molecule state, so several can run at once. Each run's
    log is kept under the cache's logs/ folder; a pass is recorded by its key."""

    def __init__(self, state_dir: Path, log=print, keep: bool = False) -> None:
        self.lab = Lab(state_dir / "_lab" / NAME, log=log)
        self.log = log
        self.keep = keep
        self._env: dict[str, str] | None = None
        self._env_lock = threading.Lock()
        self.image = image_reference()

    def __enter__(self) -> ScenarioRunner:
        return self

    def __exit__(self, *exc) -> None:
        if self._env is not None and not self.keep:
            self.lab.down(NAME)

    def prepare(self) -> dict[str, str]:
        """The lab network, the node image and the runtime repository the scenarios use, made
        once (the first caller makes them, the others wait)."""
        with self._env_lock:
            return self._environment()

    def _environment(self) -> dict[str, str]:
        if self._env is None:
            if self.lab.load() is None:
                # A one-node lab gives the scenarios a fenced network with the apt cache on its gateway.
                self.lab.up(LabSpec(name=NAME, control_planes=1, workers=0, gpu_workers=0, subnet=SUBNET),
                            self.lab.dir / "inventory.yml")
            self.image = ensure_image(self.lab.podman, self.lab.cache_dir, self.log)
            # The lab release's containerd.io (containerd 2 and runc from Go modules) as an apt
            # repository a scenario may copy onto its node: molecule has no lab mirror.
            runtime_repo = artifacts.runtime_repository(LAB_RELEASE, log=self.log)
            self._env = dict(os.environ,
                             GPUBOOT_LAB_APT_REPO=str(runtime_repo),
                             GPUBOOT_MOLECULE_NETWORK=f"gpuboot-{NAME}",
                             GPUBOOT_NODE_IMAGE=self.image,
                             CONTAINERS_CONF=str(write_containers_conf(self.lab.cache_dir)),
                             PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
        return self._env

    def record(self, role: str) -> Path:
        """The pass record for these inputs, the node image's Debian contents included."""
        tarball = image_tarball(self.lab.cache_dir)
        contents = node_image_contents(tarball) if tarball.is_file() else "unbuilt"
        return CACHE / f"{role}-{scenario_key(role, f'{self.image}@{contents}')}.log"

    def reused(self, role: str) -> ScenarioResult | None:
        """The recorded pass of the scenario with these inputs, if any (none with FRESH_ENV=1)."""
        passed = self.record(role)
        if passed.is_file() and os.environ.get(FRESH_ENV) != "1":
            self.log(f"molecule test: {role} reused: passed before with identical inputs ({passed})")
            return ScenarioResult(role, True, 0.0, passed, cached=True)
        return None

    def run(self, role: str) -> ScenarioResult:
        found = self.reused(role)
        if found is not None:
            return found
        env = self.prepare()
        LOGS.mkdir(parents=True, exist_ok=True)
        logfile = LOGS / f"{role}-{time.strftime('%Y%m%dT%H%M%S')}.log"
        self.log(f"molecule test: {role} (log {logfile})")
        t0 = time.monotonic()
        with logfile.open("w") as out:
            proc = subprocess.run(["molecule", "test"], cwd=content.content_dir() / "roles" / role, stdout=out,
                                  stderr=subprocess.STDOUT,
                                  env={**env, "GPUBOOT_MOLECULE_PREFIX": f"mol-{role.replace('_', '-')}"})
        result = ScenarioResult(role, proc.returncode == 0, round(time.monotonic() - t0, 1), logfile)
        if result.ok:
            passed = self.record(role)  # keyed by the node image as built, if the run built it
            passed.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(logfile, passed)
        self.log(f"  {'ok' if result.ok else 'FAILED'} {role} in {result.seconds}s")
        return result


    def run_all(self, roles: list[str], parallel: int = PARALLEL) -> dict[str, ScenarioResult]:
        """Every role's result, by role in the order given: the reused first, then the rest
        `parallel` at a time, then those in ALONE one by one."""
        if parallel < 1:
            raise LabError(f"--parallel {parallel}: at least one scenario must run at a time")
        results = {role: found for role in roles if (found := self.reused(role)) is not None}
        together = [role for role in roles if role not in results and role not in ALONE]
        alone = [role for role in roles if role not in results and role in ALONE]
        if together or alone:
            self.prepare()  # once, before the workers start
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="molecule") as pool:
            results.update(zip(together, pool.map(self.run, together), strict=True))
        results.update((role, self.run(role)) for role in alone)
        return {role: results[role] for role in roles}


def run_scenarios(state_dir: Path, only: tuple[str, ...] = (), log=print, keep: bool = False,
                  parallel: int = PARALLEL) -> list[ScenarioResult]:
    with ScenarioRunner(state_dir, log=log, keep=keep) as runner:
        return list(runner.run_all(roles_with_scenarios(only), parallel).values())
