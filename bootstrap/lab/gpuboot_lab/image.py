"""Builds the lab's Debian 12 node image without any registry, cached by its inputs."""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from gpuboot_lab.errors import LabError
from gpuboot_lab.locks import build_once
from gpuboot_lab.podman import Podman

# Bump when the build recipe below changes in a way the inputs do not show.
RECIPE_VERSION = "1"
SUITE = "bookworm"
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-apt", "sudo",
    "iproute2", "iputils-ping", "procps", "ca-certificates", "kmod", "pciutils", "gnupg",
]
IMAGE_NAME = "localhost/gpuboot-node"


def _customize_script() -> Path:
    return Path(str(resources.files("gpuboot_lab") / "files" / "customize-node.sh"))


def debian_sources(sources_dir: Path = Path("/etc/apt")) -> list[str]:
    """One-line apt sources for bookworm, taken from the mirrors this host already uses."""
    main_uri = security_uri = None
    files = sorted((sources_dir / "sources.list.d").glob("*.sources"))
    for f in files:
        uri = None
        for line in f.read_text().splitlines():
            if line.startswith("URIs:"):
                uri = line.split(":", 1)[1].strip().split()[0]
            if line.startswith("Suites:") and uri:
                suites = line.split(":", 1)[1].split()
                if SUITE in suites and main_uri is None:
                    main_uri = uri
                if f"{SUITE}-security" in suites and security_uri is None:
                    security_uri = uri
    legacy = sources_dir / "sources.list"
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb":
                if parts[2] == SUITE and main_uri is None:
                    main_uri = parts[1]
                if parts[2] == f"{SUITE}-security" and security_uri is None:
                    security_uri = parts[1]
    if main_uri is None:
        raise LabError(
            f"no Debian {SUITE} mirror found in {sources_dir}/sources.list(.d)",
            hint=f"configure apt on this machine with a {SUITE} source first",
        )
    lines = [f"deb {main_uri} {SUITE} main", f"deb {main_uri} {SUITE}-updates main"]
    if security_uri:
        lines.append(f"deb {security_uri} {SUITE}-security main")
    return lines


def image_key() -> str:
    digest = hashlib.sha256()
    digest.update(RECIPE_VERSION.encode())
    digest.update(SUITE.encode())
    digest.update(" ".join(PACKAGES).encode())
    digest.update(_customize_script().read_bytes())
    return digest.hexdigest()[:12]


def image_tarball(cache_dir: Path) -> Path:
    """Where the node image of today's recipe is (or will be) kept."""
    return cache_dir / f"node-{image_key()}.tar"


def image_reference() -> str:
    """The node image of today's recipe, as podman names it."""
    return f"{IMAGE_NAME}:{image_key()}"


def ensure_image(podman: Podman, cache_dir: Path, log=print) -> str:
    """Returns the image reference, building and importing it only when missing."""
    ref = image_reference()
    tarball = image_tarball(cache_dir)

    def build_and_import() -> None:
        if not tarball.exists():
            log(f"building lab node image {ref} (about a minute, cached afterwards)")
            _build_tarball(tarball)
        _import(podman, tarball, ref, log)

    build_once(tarball.parent, f"lab node image {ref}", lambda: podman.exists("image", ref), build_and_import, log)
    return ref


def _import(podman: Podman, tarball: Path, ref: str, log) -> None:
    log(f"importing {tarball.name} into podman")
    podman.run(
        "import",
        "--change", 'CMD ["/sbin/init"]',
        "--change", "STOPSIGNAL=SIGRTMIN+3",
        "--change", "ENV container=podman",
        str(tarball), ref,
    )


def _build_tarball(tarball: Path) -> None:
    tarball.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=tarball.name, suffix=".partial", dir=tarball.parent)
    os.close(fd)
    cmd = [
        "mmdebstrap", "--variant=minbase", "--skip=cleanup/apt/lists", "--format=tar",
        f"--include={','.join(PACKAGES)}",
        f"--customize-hook={_customize_script()} \"$1\"",
        SUITE, partial, *debian_sources(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(partial)
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise LabError(f"building the lab node image failed:\n{tail}", hint="apt-get install mmdebstrap")
    os.replace(partial, tarball)
