"""A small root filesystem from Debian packages, for lab images that need more than one
static binary (kube-proxy needs iptables). The packages and their dependencies come
through this machine's own apt sources into a private state directory (the host's dpkg is
never touched); nothing is pulled from a container registry."""
from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

from gpuboot_lab.errors import LabError
from gpuboot_lab.locks import build_once


def _apt(work: Path, arch: str) -> list[str]:
    return ["-o", f"APT::Architecture={arch}", "-o", f"APT::Architectures::={arch}",
            "-o", f"Dir::State::Lists={work / 'lists'}", "-o", f"Dir::Cache={work / 'cache'}",
            "-o", "Dir::State::status=/dev/null", "-o", "Debug::NoLocking=1", "-qq"]


def _closure(opts: list[str], packages: list[str]) -> list[str]:
    out = subprocess.run(["apt-cache", *opts, "depends", "--recurse", "--no-recommends", "--no-suggests",
                          "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *packages],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise LabError(f"apt-cache could not resolve {' '.join(packages)}: {out.stderr.strip()}")
    return sorted({line.strip() for line in out.stdout.splitlines()
                   if line and not line.startswith((" ", "<"))})


def fetch_debs(packages: list[str], work: Path, arch: str = "amd64", dependencies: bool = True) -> list[Path]:
    """Download the packages (and what they depend on) for `arch` into `work`, through
    this machine's apt sources and a private apt state."""
    (work / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (work / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    opts = _apt(work, arch)
    subprocess.run(["apt-get", *opts, "update"], check=True, capture_output=True)
    names = _closure(opts, packages) if dependencies else sorted(packages)
    debs = work / "debs"
    debs.mkdir(exist_ok=True)
    got = subprocess.run(["apt-get", *opts, "download", *names], capture_output=True, text=True, cwd=debs)
    if got.returncode != 0:
        raise LabError(f"apt-get download failed: {got.stderr.strip()}")
    found = []
    for name in names:
        deb = sorted(debs.glob(f"{name}_*_{arch}.deb")) + sorted(debs.glob(f"{name}_*_all.deb"))
        if not deb:
            raise LabError(f"{name} was not downloaded")
        found.append(deb[-1])
    return found


def rootfs_tar(packages: list[str], cache: Path, symlinks: dict[str, str], arch: str = "amd64") -> bytes:
    """A tar of the packages' files plus `symlinks` (path -> target; what maintainer scripts
    such as update-alternatives would have made), cached by the package set."""
    key = hashlib.sha256(repr((sorted(packages), sorted(symlinks.items()), arch)).encode()).hexdigest()[:16]
    cached = cache / f"rootfs-{key}.tar"
    work = cache / f"apt-{arch}"
    # One apt download and unpack at a time in the shared work folder.
    build_once(work, f"the {arch} root file system of {', '.join(sorted(packages))}", cached.is_file,
               lambda: _rootfs_tar(packages, work, key, symlinks, arch, cached))
    return cached.read_bytes()


def _rootfs_tar(packages: list[str], work: Path, key: str, symlinks: dict[str, str], arch: str, cached: Path) -> None:
    debs = fetch_debs(packages, work, arch)
    root = work / f"root-{key}"
    subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir()
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    for path, target in symlinks.items():
        link = root / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
            if info.isfile():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    partial = cached.with_suffix(".partial")
    partial.write_bytes(buffer.getvalue())
    partial.replace(cached)  # a reader never sees half a tar
