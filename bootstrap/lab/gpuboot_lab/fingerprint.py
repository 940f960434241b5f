"""What, besides the repository's own files, decides a lab or molecule result on this machine:
the installed Python packages, the Go toolchain the lab builds with, the host's Debian packages
the lab uses, the node image's Debian contents, and the environment variables gpuboot and
Ansible read. Every reuse key (molecule scenarios, recorded lab passes) includes it, so a
result is reused only on a machine that would run it the same way."""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

from gpuboot import content

# Switches of the test harness itself, and per-test paths: they do not change what is tested.
HARNESS_VARIABLES = frozenset({
    "GPUBOOT_TESTS_FRESH", "GPUBOOT_MOLECULE_FRESH", "GPUBOOT_REQUIRE_LAB", "GPUBOOT_STATE_DIR",
    "GPUBOOT_RUN_DIR", "GPUBOOT_MOLECULE_PREFIX", "GPUBOOT_MOLECULE_NETWORK", "GPUBOOT_NODE_IMAGE",
    # Which of .ci/run's lanes runs a module: it names the lane's shared lab only.
    "GPUBOOT_TEST_LANE",
    # How many molecule scenarios run at once: each has its own containers and state.
    "GPUBOOT_MOLECULE_PARALLEL",
    # How .ci/run and .ci/record share the suite out, and where the record's clone lives:
    # they place the tests, they change nothing a test runs.
    "GPUBOOT_TEST_LANES", "GPUBOOT_RECORD_CLONE", "GPUBOOT_BENCH_MACHINE",
})
_READ_VARIABLES = re.compile(r"^(GPUBOOT|ANSIBLE|MOLECULE)_")


def hash_files(digest, parts, relative_to) -> None:
    """Feed `digest` every file under `parts` (files or folders), by name relative to
    `relative_to(part)` and content, in a stable order; a part that does not exist counts as
    absent."""
    for part in parts:
        if not part.exists():
            digest.update(f"absent:{part.name}".encode())
            continue
        files = [part] if part.is_file() else sorted(p for p in part.rglob("*") if p.is_file())
        for file in files:
            if "__pycache__" in file.parts:
                continue
            digest.update(str(file.relative_to(relative_to(part))).encode())
            digest.update(file.read_bytes())


def python_packages() -> list[str]:
    """name==version of every installed distribution but gpuboot (its files are keyed apart)."""
    found = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version
             for d in importlib.metadata.distributions() if d.metadata["Name"]}
    found.pop("gpuboot", None)
    return [f"{name}=={version}" for name, version in sorted(found.items())]


def go_version() -> str:
    if shutil.which("go") is None:
        return "none"
    proc = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def host_package_names(root: Path | None = None) -> list[str]:
    listing = (root or content.content_dir()) / "bootstrap" / "host-packages.txt"
    if not listing.is_file():  # an installed wheel: the lab's host list is not shipped
        return []
    words = (line.split() for line in listing.read_text().splitlines() if not line.startswith("#"))
    return sorted(word for line in words for word in line)


def host_packages(root: Path | None = None) -> list[str]:
    """package=version of the host's Debian packages the lab uses (`missing` if absent)."""
    names = host_package_names(root)
    if not names or shutil.which("dpkg-query") is None:
        return []
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${Package}=${Version}\\n", *names],
                          capture_output=True, text=True)
    installed = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return [f"{name}={installed.get(name, 'missing')}" for name in names]


def node_image_contents(tarball: Path) -> str:
    """A digest of the Debian packages inside a built node image (its dpkg status), kept
    beside the tarball so that it is read once."""
    sidecar = tarball.with_suffix(".packages")
    if sidecar.is_file() and sidecar.stat().st_mtime >= tarball.stat().st_mtime:
        return sidecar.read_text().strip()
    with tarfile.open(tarball) as tar:
        member = next(m for m in tar.getmembers() if m.name.lstrip("./") == "var/lib/dpkg/status")
        status = tar.extractfile(member).read()
    packages = sorted(re.findall(rb"^Package: (\S+)\n(?:.+\n)*?Version: (\S+)", status, re.M))
    digest = hashlib.sha256(b"\n".join(b"=".join(p) for p in packages)).hexdigest()[:16]
    sidecar.write_text(digest + "\n")
    return digest


def environment() -> dict[str, str]:
    """The GPUBOOT_, ANSIBLE_ and MOLECULE_ variables set now, but the harness's own."""
    return {k: v for k, v in sorted(os.environ.items()) if _READ_VARIABLES.match(k) and k not in HARNESS_VARIABLES}


@functools.cache
def _machine() -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    return tuple(python_packages()), go_version(), tuple(host_packages())


def fingerprint(node_image: Path | None = None) -> dict[str, object]:
    """Everything above, as one JSON-able record (the node image when its tarball is given)."""
    packages, go, host = _machine()
    record: dict[str, object] = {"python": list(packages), "go": go, "host": list(host), "env": environment()}
    if node_image is not None:
        record["node_image"] = f"{node_image.name}:{node_image_contents(node_image)}"
    return record


def fingerprint_digest(node_image: Path | None = None) -> str:
    return hashlib.sha256(json.dumps(fingerprint(node_image), sort_keys=True).encode()).hexdigest()[:16]
