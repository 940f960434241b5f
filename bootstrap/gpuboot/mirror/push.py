"""Air-gapped side: push a bundle into the mirror registry.

Order is what makes a failure safe: every blob first (each hashed once while it streams,
shared layers uploaded once and mounted into the other repositories, both cores busy),
manifests and tags only when every blob of every artifact arrived intact. A corrupted or
truncated bundle therefore leaves no tag behind that points at an incomplete image; the
orphan blobs it may leave are unreferenced and re-used by the next import."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from threading import Lock

from gpuboot.errors import MirrorError
from gpuboot.mirror import packages
from gpuboot.mirror.bundle import Artifact, Bundle, HashingReader
from gpuboot.mirror.registry import Manifest, Registry


@dataclass
class ImportSummary:
    artifacts: int
    already_present: int
    blobs_uploaded: int
    blobs_mounted: int
    blobs_present: int
    bytes_uploaded: int
    seconds: float
    packages: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_uploaded / 1e6 / self.seconds if self.seconds else 0.0


@dataclass
class _BlobJob:
    digest: str
    size: int
    repositories: list[str]
    artifacts: list[str]


class Importer:
    def __init__(self, bundle: Bundle, registry: Registry, *, workers: int | None = None,
                 progress: Callable[[str], None] = lambda message: None, packages_dir: Path | None = None,
                 gpg_home: str | None = None, gpg_key: str | None = None) -> None:
        self.bundle, self.registry, self.progress = bundle, registry, progress
        self.packages_dir, self.gpg_home, self.gpg_key = packages_dir, gpg_home, gpg_key
        self.workers = workers or max(2, os.cpu_count() or 2)
        self._lock = Lock()
        self.uploaded = self.mounted = self.present = self.bytes = 0

    def run(self, allowed_signers: str | None = None) -> ImportSummary:
        started = time.monotonic()
        _release, everything = self.bundle.read_manifest(allowed_signers)
        package_artifacts = [a for a in everything if a.kind == "package"]
        artifacts = [a for a in everything if a.kind != "package"]
        with ThreadPoolExecutor(self.workers) as pool:
            tagged = list(pool.map(self._already_there, artifacts))
        todo = [a for a, done in zip(artifacts, tagged, strict=True) if not done]
        self.progress(f"{len(artifacts)} artifacts in the bundle, {len(artifacts) - len(todo)} already in the mirror")
        self._check_files(todo + (package_artifacts if self.packages_dir else []))
        jobs = self._blob_jobs(todo)
        failures: list[str] = []
        with ThreadPoolExecutor(self.workers) as pool:
            for error in pool.map(self._push_blob, jobs):
                if error:
                    failures.append(error)
        if failures:
            raise MirrorError(f"import stopped before any manifest was written; {len(failures)} blob(s) failed:\n  "
                              + "\n  ".join(failures),
                              hint="copy the bundle again (or re-run `mirror pull` on the connected side) and "
                                   "re-run the import: blobs that arrived are not sent twice")
        for count, artifact in enumerate(todo, 1):
            self._push_manifests(artifact)
            self.progress(f"[{count}/{len(todo)}] {artifact.ref} ({artifact.size / 1e6:.1f} MB)")
        self._write_packages(package_artifacts)
        return ImportSummary(len(artifacts), len(artifacts) - len(todo), self.uploaded, self.mounted,
                             self.present, self.bytes, time.monotonic() - started, len(package_artifacts))

    def _write_packages(self, artifacts: list[Artifact]) -> None:
        if not artifacts:
            return
        if self.packages_dir is None:
            self.progress(f"note: {len(artifacts)} packages in the bundle were not written (pass --packages-dir)")
            return
        files = [(a.repository.removeprefix("packages/"), a.tag, self.bundle.blob_path(a.digest), a.digest,
                  a.blobs[0]["size"]) for a in artifacts]
        changed = packages.install(self.packages_dir, files)
        for os_id in sorted({f[0] for f in files}):
            if os_id in changed or not (self.packages_dir / os_id / "Release").is_file():
                packages.write_index(self.packages_dir / os_id, self.gpg_home, self.gpg_key)
        self.progress(f"{len(artifacts)} packages in {self.packages_dir} "
                      f"({', '.join(sorted(changed)) or 'nothing'} changed)")

    def _already_there(self, artifact: Artifact) -> bool:
        return self.registry.manifest_digest(artifact.repository, artifact.tag) == artifact.digest

    def _check_files(self, artifacts: list[Artifact]) -> None:
        """Missing or short files fail before anything is sent, naming the artifact."""
        problems = []
        for artifact in artifacts:
            for item in artifact.manifests + artifact.blobs:
                path = self.bundle.blob_path(item["digest"])
                have = path.stat().st_size if path.is_file() else None
                if have != item["size"]:
                    state = "missing" if have is None else f"truncated ({have} of {item['size']} bytes)"
                    problems.append(f"{artifact.ref}: blob {item['digest']} is {state}")
        if problems:
            raise MirrorError(f"bundle {self.bundle.root} is incomplete; nothing was imported:\n  "
                              + "\n  ".join(problems),
                              hint="copy the bundle again, or re-run `mirror pull` into it to fetch what is missing")

    @staticmethod
    def _blob_jobs(artifacts: list[Artifact]) -> list[_BlobJob]:
        jobs: dict[str, _BlobJob] = {}
        for artifact in artifacts:
            for blob in artifact.blobs:
                job = jobs.setdefault(blob["digest"], _BlobJob(blob["digest"], blob["size"], [], []))
                if artifact.repository not in job.repositories:
                    job.repositories.append(artifact.repository)
                job.artifacts.append(artifact.ref)
        # Largest first: the long uploads start early and the cores stay busy to the end.
        return sorted(jobs.values(), key=lambda j: -j.size)

    def _count(self, field: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self, field, getattr(self, field) + amount)

    def _push_blob(self, job: _BlobJob) -> str | None:
        label = ", ".join(sorted(set(job.artifacts))[:3]) + (" ..." if len(set(job.artifacts)) > 3 else "")
        try:
            first, *others = job.repositories
            if self.registry.has_blob(first, job.digest):
                self._count("present")
            else:
                with open(self.bundle.blob_path(job.digest), "rb") as handle:
                    reader = HashingReader(handle, job.digest, job.size, label)
                    self.registry.upload_blob(first, job.digest, job.size, reader)
                    reader.check()
                self._count("uploaded")
                self._count("bytes", job.size)
            for repository in others:
                if self.registry.has_blob(repository, job.digest):
                    self._count("present")
                elif self.registry.mount_blob(repository, job.digest, first):
                    self._count("mounted")
                else:
                    raise MirrorError(f"{label}: registry refused to mount {job.digest} into {repository}")
            return None
        except MirrorError as exc:
            return exc.message

    def _push_manifests(self, artifact: Artifact) -> None:
        for item in artifact.manifests:
            body = self.bundle.read_blob(item["digest"])
            manifest = Manifest(body, item["media_type"], item["digest"])
            is_top = item["digest"] == artifact.digest
            self.registry.put_manifest(artifact.repository, artifact.tag if is_top else item["digest"], manifest)
