"""The transfer bundle: one directory that crosses the air gap.

    BUNDLE/blobs/sha256/<hex>   every layer, config, manifest and chart, stored once
    BUNDLE/bundle.json          every artifact with its digest, size and blobs
    BUNDLE/bundle.json.sha256   checksum of bundle.json (and .sig when signed)

A blob gets its final name only after its digest was checked, so an interrupted pull
resumes by skipping every blob that exists."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gpuboot.errors import MirrorError

FORMAT = "gpuboot-bundle/1"
MANIFEST = "bundle.json"
SIGNATURE_NAMESPACE = "gpuboot-bundle"


@dataclass
class Artifact:
    """One image or chart: its repository and tag in the mirror, the manifests (children
    before their index) and the blobs they reference."""

    kind: str
    ref: str
    repository: str
    tag: str
    digest: str
    media_type: str
    manifests: list[dict] = field(default_factory=list)
    blobs: list[dict] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(m["size"] for m in self.manifests) + sum(b["size"] for b in self.blobs)

    def to_json(self) -> dict:
        return {"kind": self.kind, "ref": self.ref, "repository": self.repository, "tag": self.tag,
                "digest": self.digest, "media_type": self.media_type, "size": self.size,
                "manifests": self.manifests, "blobs": self.blobs}

    @classmethod
    def from_json(cls, data: dict) -> Artifact:
        return cls(data["kind"], data["ref"], data["repository"], data["tag"], data["digest"],
                   data["media_type"], list(data["manifests"]), list(data["blobs"]))


class Bundle:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blob_dir = self.root / "blobs" / "sha256"

    def blob_path(self, digest: str) -> Path:
        algorithm, _, hexpart = digest.partition(":")
        if algorithm != "sha256" or len(hexpart) != 64:
            raise MirrorError(f"bundle: unsupported digest {digest!r}")
        return self.blob_dir / hexpart

    def has_blob(self, digest: str, size: int) -> bool:
        path = self.blob_path(digest)
        return path.is_file() and path.stat().st_size == size

    def write_blob(self, digest: str, chunks, expected_size: int | None = None) -> int:
        """Store a blob from an iterable of bytes, checking its digest before naming it."""
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        final = self.blob_path(digest)
        partial = final.with_name(final.name + ".partial")
        hasher, size = hashlib.sha256(), 0
        with open(partial, "wb") as out:
            for chunk in chunks:
                hasher.update(chunk)
                out.write(chunk)
                size += len(chunk)
        got = "sha256:" + hasher.hexdigest()
        if got != digest or (expected_size is not None and size != expected_size):
            partial.unlink()
            raise MirrorError(f"downloaded blob {digest} has digest {got} and {size} bytes"
                              f"{f' (expected {expected_size})' if expected_size is not None else ''}")
        os.replace(partial, final)
        return size

    def store(self, data: bytes) -> dict:
        """Keep bytes made in memory (a manifest, a config, a chart, a package); return the
        {digest, size} descriptor. Idempotent: an existing blob is not written again."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if not self.has_blob(digest, len(data)):
            self.write_blob(digest, [data], len(data))
        return {"digest": digest, "size": len(data)}

    def read_blob(self, digest: str) -> bytes:
        data = self.blob_path(digest).read_bytes()
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise MirrorError(f"bundle blob {digest} is corrupted")
        return data

    # -- the manifest --------------------------------------------------------------
    def write_manifest(self, release: str, artifacts: list[Artifact], sign_key: str | None = None) -> Path:
        body = json.dumps({"format": FORMAT, "release": release,
                           "artifacts": [a.to_json() for a in artifacts]}, indent=1, sort_keys=True).encode()
        path = self.root / MANIFEST
        tmp = path.with_suffix(".json.tmp")
        tmp.write_bytes(body)
        os.replace(tmp, path)
        (self.root / (MANIFEST + ".sha256")).write_text(f"{hashlib.sha256(body).hexdigest()}  {MANIFEST}\n")
        if sign_key:
            sig = self.root / (MANIFEST + ".sig")
            sig.unlink(missing_ok=True)
            proc = subprocess.run(["ssh-keygen", "-Y", "sign", "-q", "-f", sign_key, "-n", SIGNATURE_NAMESPACE,
                                   str(path)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise MirrorError(f"signing {path} with {sign_key} failed: {proc.stderr.strip()}",
                                  hint="use an SSH private key (ssh-keygen -t ed25519) without a passphrase prompt")
        return path

    def read_manifest(self, allowed_signers: str | None = None) -> tuple[str, list[Artifact]]:
        path = self.root / MANIFEST
        check = self.root / (MANIFEST + ".sha256")
        if not path.is_file() or not check.is_file():
            raise MirrorError(f"{self.root} is not a complete bundle: {MANIFEST} or its checksum is missing",
                              hint="re-run `gpuboot mirror pull` to finish it, or copy the whole bundle directory")
        body = path.read_bytes()
        expected = check.read_text().split()[0]
        if hashlib.sha256(body).hexdigest() != expected:
            raise MirrorError(f"{path} does not match its checksum {check.name}: the bundle was changed or damaged",
                              hint="copy the bundle again from the connected side")
        if allowed_signers:
            self._verify_signature(path, allowed_signers)
        data = json.loads(body)
        if data.get("format") != FORMAT:
            raise MirrorError(f"{path}: unknown bundle format {data.get('format')!r} (this gpuboot reads {FORMAT})")
        return data["release"], [Artifact.from_json(a) for a in data["artifacts"]]

    def _verify_signature(self, path: Path, allowed_signers: str) -> None:
        sig = self.root / (MANIFEST + ".sig")
        if not sig.is_file():
            raise MirrorError(f"{path} is not signed but signers were given",
                              hint="sign the bundle on the connected side (`mirror pull --sign-key`)")
        with open(path, "rb") as data:
            proc = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", allowed_signers, "-I", "gpuboot",
                                   "-n", SIGNATURE_NAMESPACE, "-s", str(sig)], stdin=data, capture_output=True, text=True)
        if proc.returncode != 0:
            raise MirrorError(f"signature of {path} does not verify against {allowed_signers}: "
                              f"{(proc.stderr or proc.stdout).strip()}")


class HashingReader:
    """Reads a bundle blob for an upload while hashing it: the one pass that verifies
    each byte. At the end a wrong digest or size raises, which aborts the upload before
    the registry can commit it."""

    def __init__(self, handle: BinaryIO, digest: str, size: int, label: str) -> None:
        self.handle, self.digest, self.size, self.label = handle, digest, size, label
        self.hasher = hashlib.sha256()
        self.read_bytes = 0

    def read(self, amount: int = -1) -> bytes:
        chunk = self.handle.read(amount)
        self.hasher.update(chunk)
        self.read_bytes += len(chunk)
        if not chunk or self.read_bytes == self.size:
            self.check()
        return chunk

    def check(self) -> None:
        got = "sha256:" + self.hasher.hexdigest()
        if self.read_bytes != self.size or got != self.digest:
            raise CorruptBlob(f"{self.label}: bundle blob {self.digest} is corrupted "
                              f"({self.read_bytes} of {self.size} bytes, digest {got})")


class CorruptBlob(MirrorError):
    """A bundle blob whose bytes do not match its digest."""
