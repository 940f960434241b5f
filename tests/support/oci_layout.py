"""Multi-architecture OCI image layouts built in-process (nothing pulled): every image
carries the same static busybox layer per architecture (so layers are shared between
images, as real ones are) and a small layer of its own. skopeo copies them into the
test's upstream registry; digests are identical on every run."""
from __future__ import annotations

import gzip
import hashlib
import json
import random
import subprocess
from pathlib import Path

from gpuboot_lab.debroot import fetch_debs
from gpuboot_lab.locks import building
from tests.support.oci_image import _blob, _tar

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
ARCH_PACKAGES = ("amd64", "arm64")


def busybox_binaries(cache: Path) -> dict[str, bytes]:
    """Debian's busybox-static for amd64 and arm64, downloaded once into `cache` through the
    machine's own apt sources (a separate state dir: the host's dpkg is not touched)."""
    cache.mkdir(parents=True, exist_ok=True)
    binaries: dict[str, bytes] = {}
    for arch in ARCH_PACKAGES:
        target = cache / f"busybox-{arch}"
        if not target.is_file():
            work = cache / f"apt-{arch}"
            with building(work, f"busybox-static for {arch}", print):  # .ci/run's other lane may want it too
                if not target.is_file():
                    deb = fetch_debs(["busybox-static"], work, arch, dependencies=False)[0]
                    extract = work / "root"
                    subprocess.run(["dpkg-deb", "-x", str(deb), str(extract)], check=True)
                    target.with_suffix(".partial").write_bytes((extract / "bin" / "busybox").read_bytes())
                    target.with_suffix(".partial").replace(target)
        binaries[arch] = target.read_bytes()
    return binaries


def _platform_manifest(blobs: dict[str, bytes], busybox: bytes, arch: str, own: bytes) -> dict:
    shared_tar = _tar([("bin/busybox", busybox, 0o755), ("bin/sh", busybox, 0o755)])
    own_tar = _tar([("etc/image-id", own, 0o644)])
    layers = [_blob(blobs, gzip.compress(t, mtime=0)) for t in (shared_tar, own_tar)]
    config = _blob(blobs, json.dumps({
        "architecture": arch, "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox"], "Cmd": ["sh"]},
        "rootfs": {"type": "layers",
                   "diff_ids": ["sha256:" + hashlib.sha256(t).hexdigest() for t in (shared_tar, own_tar)]},
    }, sort_keys=True).encode())
    manifest = _blob(blobs, json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": LAYER, **layer} for layer in layers],
    }, sort_keys=True).encode())
    return {"mediaType": MANIFEST, **manifest, "platform": {"architecture": arch, "os": "linux"}}


def write_layout(directory: Path, tag: str, binaries: dict[str, bytes], image_id: str,
                 padding: int = 0) -> str:
    """An OCI layout with one multi-arch image under `tag`; returns the index digest.
    `padding` adds that many pseudo-random bytes to the image's own layer (benchmarks)."""
    blobs: dict[str, bytes] = {}
    own = image_id.encode() + (_noise(image_id, padding) if padding else b"")
    platforms = [_platform_manifest(blobs, binaries[arch], arch, own) for arch in sorted(binaries)]
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": platforms}, sort_keys=True).encode()
    index_desc = _blob(blobs, index)
    (directory / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    for digest, data in blobs.items():
        path = directory / "blobs" / "sha256" / digest.split(":", 1)[1]
        if not path.exists():
            path.write_bytes(data)
    (directory / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    index_path = directory / "index.json"
    top = json.loads(index_path.read_text()) if index_path.exists() else {"schemaVersion": 2, "manifests": []}
    top["manifests"] = [m for m in top["manifests"]
                        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag]
    top["manifests"].append({"mediaType": INDEX, **index_desc,
                             "annotations": {"org.opencontainers.image.ref.name": tag}})
    index_path.write_text(json.dumps(top, sort_keys=True))
    return index_desc["digest"]


def _noise(seed: str, size: int) -> bytes:
    """Incompressible bytes, reproducible from the seed."""
    return random.Random(seed).randbytes(size)


def push(layout: Path, tag: str, destination: str) -> None:
    """Copy one image of the layout into a registry with skopeo, keeping every digest."""
    subprocess.run(["skopeo", "copy", "--all", "--preserve-digests", "--dest-tls-verify=false", "-q",
                    f"oci:{layout}:{tag}", f"docker://{destination}"], check=True, capture_output=True)
