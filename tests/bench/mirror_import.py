"""Benchmark: `gpuboot mirror import` against a plain copy of the same bytes, one sha256
pass over them (the cost of verifying each byte once), and `skopeo copy` of the same
images, side by side on this machine. Not a test: run it by hand, record the numbers.

    .venv/bin/python -m tests.bench.mirror_import --images 12 --layer-mb 20

Every image has its own incompressible layer plus the busybox layers all images share
(per architecture), so the shared-layer accounting is visible too. All registries are
real CNCF distribution registries on loopback over plain HTTP (same for every contender)."""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpuboot import matrix
from gpuboot.mirror.bundle import Bundle
from gpuboot.mirror.plan import build
from gpuboot.mirror.pull import Puller, Sources
from gpuboot.mirror.push import Importer
from gpuboot.mirror.registry import Registry
from gpuboot.mirror.serve import ServeSpec, start
from tests.support.mirror_fixture import free_port, start_upstream


def timed(func) -> tuple[float, object]:
    started = time.monotonic()
    result = func()
    return time.monotonic() - started, result


def sha256_pass(files: list[Path]) -> None:
    for path in files:
        with open(path, "rb") as handle:
            hashlib.file_digest(handle, "sha256")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--layer-mb", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=0, help="import workers (default: cores)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpuboot-bench-"))
    registries = []
    try:
        images = {f"nvcr.io/nvidia/bench/image{i:02d}:v1": f"image{i:02d}" for i in range(args.images)}
        upstream = start_upstream(root / "up", images, padding=int(args.layer_mb * 1e6), release="bench")
        registries.append(upstream.registry)
        release = matrix.load("bench", upstream.releases_dir)
        plan = build(release)
        sources = Sources({"nvcr.io": f"{upstream.registry.spec.url}/nvcr.io"})
        bundle = Bundle(root / "bundle")
        pull_s, pulled = timed(lambda: Puller(bundle, sources).run(plan))
        _name, artifacts = bundle.read_manifest()
        unique = {b["digest"]: b["size"] for a in artifacts for b in a.blobs + a.manifests}
        unique_bytes = sum(unique.values())
        per_image_bytes = sum(a.size for a in artifacts)
        files = [bundle.blob_path(d) for d in unique]

        copy_s, _ = timed(lambda: shutil.copytree(bundle.blob_dir, root / "plain-copy"))
        hash1_s, _ = timed(lambda: sha256_pass(files))
        halves = [files[0::2], files[1::2]]
        hash2_s, _ = timed(lambda: list(ThreadPoolExecutor(2).map(sha256_pass, halves)))

        def fresh(name: str):
            running = start(ServeSpec(root / name, f"127.0.0.1:{free_port()}", tls=False))
            registries.append(running)
            return running

        skopeo_target = fresh("skopeo-dest")

        def skopeo_all() -> None:
            for ref in images:
                subprocess.run(["skopeo", "copy", "--all", "--preserve-digests", "-q", "--src-tls-verify=false",
                                "--dest-tls-verify=false", f"docker://{upstream.registry.spec.listen}/{ref}",
                                f"docker://{skopeo_target.spec.listen}/{ref}"], check=True)
        skopeo_s, _ = timed(skopeo_all)

        target = fresh("gpuboot-dest")
        workers = args.workers or None
        import_s, summary = timed(lambda: Importer(bundle, Registry(target.spec.url), workers=workers).run())
        noop_s, noop = timed(lambda: Importer(bundle, Registry(target.spec.url), workers=workers).run())
        single = fresh("gpuboot-dest-1worker")
        import1_s, _ = timed(lambda: Importer(bundle, Registry(single.spec.url), workers=1).run())

        mb = unique_bytes / 1e6
        rate = lambda seconds: round(mb / seconds, 1)  # noqa: E731
        report = {
            "images": len(artifacts), "unique_mb": round(mb, 1), "mb_counting_shared_per_image": round(per_image_bytes / 1e6, 1),
            "blobs_uploaded": summary.blobs_uploaded, "blobs_mounted": summary.blobs_mounted,
            "pull_s": round(pull_s, 2), "pull_mb_s": rate(pull_s),
            "plain_copy_s": round(copy_s, 2), "plain_copy_mb_s": rate(copy_s),
            "sha256_1core_mb_s": rate(hash1_s), "sha256_2cores_mb_s": rate(hash2_s),
            "skopeo_copy_s": round(skopeo_s, 2), "skopeo_mb_s": rate(skopeo_s),
            "import_s": round(import_s, 2), "import_mb_s": rate(import_s),
            "import_1worker_s": round(import1_s, 2), "import_1worker_mb_s": rate(import1_s),
            "noop_reimport_s": round(noop_s, 3), "noop_already_present": noop.already_present,
            "import_vs_skopeo": round(skopeo_s / import_s, 2),
            "import_vs_plain_copy": round(import_s / copy_s, 2),
            "import_vs_sha256_1core": round(import_s / hash1_s, 2),
        }
        print(json.dumps(report, indent=2))
    finally:
        for running in registries:
            running.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
