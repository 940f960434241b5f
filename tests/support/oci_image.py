#!/usr/bin/env python3
"""Write a real, runnable OCI image without pulling anything: one layer holding a static
busybox (from Debian's busybox-static package) as /bin/busybox and /bin/sh, as an OCI
image-layout tar that `ctr images import` and skopeo read. Fixed mtimes, owners and gzip
header make the digests identical on every run.

usage: oci_image.py BUSYBOX_BINARY OUT.tar IMAGE_NAME [ARCH]"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile


def _tar(entries: list[tuple[str, bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, 0, 0, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def build(busybox: bytes, image_name: str, arch: str = "amd64") -> bytes:
    blobs: dict[str, bytes] = {}
    layer_tar = _tar([("bin/busybox", busybox, 0o755), ("bin/sh", busybox, 0o755)])
    layer = _blob(blobs, gzip.compress(layer_tar, mtime=0))
    config = _blob(blobs, json.dumps({
        "architecture": arch, "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox"], "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer_tar).hexdigest()]},
    }, sort_keys=True).encode())
    manifest = _blob(blobs, json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    }, sort_keys=True).encode())
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest,
        "platform": {"architecture": arch, "os": "linux"},
        "annotations": {"io.containerd.image.name": image_name,
                        "org.opencontainers.image.ref.name": image_name.rsplit(":", 1)[-1]}}]}
    files = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644),
             ("index.json", json.dumps(index, sort_keys=True).encode(), 0o644)]
    files += [(f"blobs/sha256/{d.split(':', 1)[1]}", data, 0o644) for d, data in sorted(blobs.items())]
    return _tar(files)


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as handle:
        payload = build(handle.read(), sys.argv[3], *(sys.argv[4:5]))
    with open(sys.argv[2], "wb") as handle:
        handle.write(payload)
