"""OS packages in the air gap: taken from a directory on the connected side (what
`apt-get download` fetched for each OS: DIR/<os id>/*.deb), carried in the bundle, and
written on the air-gapped side into one flat apt repository per OS (`deb URL/<os id>/ ./`),
with Packages, Release and, given a GnuPG key, InRelease and Release.gpg."""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

from gpuboot.errors import MirrorError
from gpuboot.mirror.plan import PlannedPackage

DEB = "application/vnd.debian.binary-package"


@dataclass(frozen=True)
class PackageFile:
    os: str
    path: Path
    name: str
    version: str

    @property
    def ref(self) -> str:
        return f"{self.os}: {self.name}={self.version}"


def deb_fields(path: Path) -> dict[str, str]:
    """The control fields of a .deb (dpkg-deb reads it; nothing is installed)."""
    proc = subprocess.run(["dpkg-deb", "-f", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise MirrorError(f"{path} is not a readable .deb: {proc.stderr.strip()}")
    fields: dict[str, str] = {}
    key = None
    for line in proc.stdout.splitlines():
        if line[:1] in (" ", "\t") and key:
            fields[key] += "\n" + line
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def collect(source: Path, wanted: list[PlannedPackage]) -> list[PackageFile]:
    """Every package under source/<os id>/ for the planned OSes; the planned ones must be there."""
    found: list[PackageFile] = []
    for os_id in sorted({p.os for p in wanted}):
        for path in sorted((source / os_id).glob("*.deb")):
            fields = deb_fields(path)
            found.append(PackageFile(os_id, path, fields["Package"], fields["Version"]))
    have = {(f.os, f.name, f.version) for f in found}
    names = {(f.os, f.name) for f in found}
    missing = [str(p) for p in wanted
               if ((p.os, p.name, p.version) not in have if p.version else (p.os, p.name) not in names)]
    if missing:
        raise MirrorError(f"{len(missing)} planned package(s) are not in {source}:\n  " + "\n  ".join(missing),
                          hint=f"download them into {source}/<os id>/ (e.g. `apt-get download NAME=VERSION` "
                               "with the OS's sources), then pull again")
    return found


def _sha256_copy(src: Path, dest: Path, digest: str, size: int, label: str) -> None:
    hasher = hashlib.sha256()
    tmp = dest.with_name(dest.name + ".partial")
    with open(src, "rb") as inp, open(tmp, "wb") as out:
        while chunk := inp.read(1 << 20):
            hasher.update(chunk)
            out.write(chunk)
    got = "sha256:" + hasher.hexdigest()
    if got != digest or tmp.stat().st_size != size:
        tmp.unlink()
        raise MirrorError(f"{label}: bundle blob {digest} is corrupted (digest {got})")
    os.replace(tmp, dest)


def install(repo_dir: Path, files: list[tuple[str, str, Path, str, int]]) -> set[str]:
    """Copy (os, filename, blob path, digest, size) into repo_dir/<os>/, verified; return
    the OSes whose repository changed."""
    changed: set[str] = set()
    for os_id, filename, blob, digest, size in files:
        target_dir = repo_dir / os_id
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / filename
        if target.is_file() and target.stat().st_size == size and \
                "sha256:" + hashlib.sha256(target.read_bytes()).hexdigest() == digest:
            continue
        _sha256_copy(blob, target, digest, size, f"{os_id}/{filename}")
        changed.add(os_id)
    return changed


def write_index(os_dir: Path, gpg_home: str | None = None, gpg_key: str | None = None) -> None:
    """Packages, Packages.gz and Release for a flat repository; signed when a key is given."""
    stanzas = []
    for deb in sorted(os_dir.glob("*.deb")):
        fields = deb_fields(deb)
        data = deb.read_bytes()
        fields.update({"Filename": f"./{deb.name}", "Size": str(len(data)),
                       "SHA256": hashlib.sha256(data).hexdigest()})
        stanzas.append("\n".join(f"{k}: {v}" for k, v in fields.items()))
    packages = ("\n\n".join(stanzas) + "\n").encode()
    (os_dir / "Packages").write_bytes(packages)
    (os_dir / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    lines = ["Origin: gpuboot", f"Label: gpuboot mirror {os_dir.name}", f"Date: {formatdate(usegmt=True)}",
             "SHA256:"]
    for name in ("Packages", "Packages.gz"):
        data = (os_dir / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    (os_dir / "Release").write_text("\n".join(lines) + "\n")
    for stale in ("InRelease", "Release.gpg"):
        (os_dir / stale).unlink(missing_ok=True)
    if gpg_key:
        _sign(os_dir, gpg_home, gpg_key)


def _sign(os_dir: Path, gpg_home: str | None, gpg_key: str) -> None:
    if shutil.which("gpg") is None:
        raise MirrorError("gpg is not installed, so the repository cannot be signed", hint="apt-get install gpg")
    base = ["gpg", "--batch", "--yes", "--pinentry-mode", "loopback", "--local-user", gpg_key]
    if gpg_home:
        base[1:1] = ["--homedir", gpg_home]
    release = str(os_dir / "Release")
    for extra in (["--clearsign", "-o", str(os_dir / "InRelease")],
                  ["--detach-sign", "-o", str(os_dir / "Release.gpg")]):
        proc = subprocess.run([*base, *extra, release], capture_output=True, text=True)
        if proc.returncode != 0:
            raise MirrorError(f"signing {release} with key {gpg_key} failed: {proc.stderr.strip()}",
                              hint="pass --gpg-home with the key's GnuPG home and a key without a passphrase prompt")


def new_signing_key(gpg_home: str, uid: str, expires: str = "never") -> None:
    """A passphrase-less ed25519 signing key for the package repositories (a lab's or a
    test's; an operator brings their own)."""
    subprocess.run(["gpg", "--homedir", gpg_home, "--batch", "--passphrase", "", "--quick-gen-key", uid,
                    "ed25519", "sign", expires], check=True, capture_output=True)


def export_public_key(gpg_home: str | None, gpg_key: str, dest: Path) -> None:
    """The key nodes use as signed-by (gpuboot.mirror.packages_key_file)."""
    argv = ["gpg", "--batch", "--armor", "--export", gpg_key]
    if gpg_home:
        argv[1:1] = ["--homedir", gpg_home]
    with tempfile.TemporaryFile() as out:
        subprocess.run(argv, stdout=out, check=True)
        out.seek(0)
        dest.write_bytes(out.read())
