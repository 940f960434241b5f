"""Connected side: fetch every image and chart of a plan into a bundle.

Images keep every platform of their index (the digest of an index covers all its
children, and a registry refuses an index whose children are missing). Blobs are
fetched in parallel, each once, and are skipped when the bundle already holds them."""
from __future__ import annotations

import hashlib
import io
import json
import ssl
import tarfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from threading import Lock

import yaml

from gpuboot.errors import MirrorError
from gpuboot.mirror import packages
from gpuboot.mirror.bundle import Artifact, Bundle
from gpuboot.mirror.plan import Plan, PlannedChart
from gpuboot.mirror.refs import ImageRef
from gpuboot.mirror.registry import Manifest, Registry, blobs_of, children, sha256_digest

HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
HELM_CONTENT = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
# Registries whose API lives on another host than their image names say.
API_HOSTS = {"docker.io": "registry-1.docker.io"}


class Sources:
    """Where each upstream registry is reached from the connected side. Defaults to the
    registry itself over HTTPS; `--source HOST=URL` overrides one (an internal proxy, or
    a test registry holding nvcr.io's images under /nvcr.io)."""

    def __init__(self, overrides: dict[str, str] | None = None, *, ca_file: str | None = None,
                 credentials: dict[str, tuple[str, str]] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self.ca_file = ca_file
        self.credentials = dict(credentials or {})
        self._registries: dict[str, Registry] = {}
        self._lock = Lock()

    def registry(self, host: str) -> Registry:
        with self._lock:
            if host not in self._registries:
                url = self.overrides.get(host) or f"https://{API_HOSTS.get(host, host)}"
                self._registries[host] = Registry(url, ca_file=self.ca_file, credentials=self.credentials.get(host))
            return self._registries[host]

    def url(self, url: str) -> str:
        """A chart repository URL, rewritten when its host has an override."""
        parsed = urllib.parse.urlsplit(url)
        override = self.overrides.get(parsed.netloc)
        return override.rstrip("/") + parsed.path if override else url

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)


@dataclass
class PullSummary:
    artifacts: int
    blobs_fetched: int
    blobs_present: int
    bytes_fetched: int
    seconds: float


class Puller:
    def __init__(self, bundle: Bundle, sources: Sources, *, workers: int = 4,
                 progress: Callable[[str], None] = lambda message: None) -> None:
        self.bundle, self.sources, self.workers, self.progress = bundle, sources, workers, progress
        self._pending: dict[str, Future] = {}
        self._lock = Lock()
        self.fetched = self.present = self.bytes = 0

    def run(self, plan: Plan, sign_key: str | None = None, packages_from: Path | None = None) -> PullSummary:
        started = time.monotonic()
        artifacts: list[Artifact] = []
        failures: list[str] = []
        # Packages first: a missing one is found in a second, not after the images' download.
        package_files = packages.collect(packages_from, plan.packages) if packages_from else []
        with ThreadPoolExecutor(self.workers) as pool:
            self.pool = pool
            jobs = [(str(i.ref), pool.submit(self._image, i.ref)) for i in plan.images]
            jobs += [(str(c), pool.submit(self._chart, c)) for c in plan.charts]
            for total, (label, job) in enumerate(jobs, 1):
                try:
                    artifact = job.result()
                    self._wait_blobs(artifact)
                    artifacts.append(artifact)
                    self.progress(f"[{total}/{len(jobs)}] {label} ({artifact.size / 1e6:.1f} MB)")
                except MirrorError as exc:
                    failures.append(f"{label}: {exc.message}")
                    self.progress(f"[{total}/{len(jobs)}] {label} FAILED: {exc.message}")
        if failures:
            raise MirrorError(f"{len(failures)} of {len(jobs)} artifacts could not be pulled:\n  "
                              + "\n  ".join(failures),
                              hint="fix the sources and re-run the same pull: finished blobs are kept")
        artifacts += [self._package(f) for f in package_files]
        if plan.packages and not packages_from:
            self.progress(f"note: the {len(plan.packages)} planned OS packages are not in this bundle "
                          "(pass --packages-from DIR with DIR/<os id>/*.deb)")
        self.bundle.write_manifest(plan.release, artifacts, sign_key)
        return PullSummary(len(artifacts), self.fetched, self.present, self.bytes, time.monotonic() - started)

    # -- blobs -------------------------------------------------------------------
    def _fetch_blob(self, registry: Registry, repository: str, digest: str, size: int) -> None:
        if self.bundle.has_blob(digest, size):
            with self._lock:
                self.present += 1
            return
        written = self.bundle.write_blob(digest, registry.blob_chunks(repository, digest), size)
        with self._lock:
            self.fetched += 1
            self.bytes += written

    def _queue_blob(self, registry: Registry, repository: str, digest: str, size: int) -> None:
        with self._lock:
            if digest not in self._pending:
                self._pending[digest] = self.pool.submit(self._fetch_blob, registry, repository, digest, size)

    def _wait_blobs(self, artifact: Artifact) -> None:
        for blob in artifact.blobs:
            future = self._pending.get(blob["digest"])
            if future is not None:
                future.result()

    def _store_manifest(self, manifest: Manifest) -> dict:
        return {**self.bundle.store(manifest.body), "media_type": manifest.media_type}

    # -- images ------------------------------------------------------------------
    def _image(self, ref: ImageRef) -> Artifact:
        registry = self.sources.registry(ref.registry)
        top = registry.manifest(ref.repository, ref.digest or ref.tag)
        if ref.digest and top.digest != ref.digest:
            raise MirrorError(f"{ref}: registry served digest {top.digest}")
        manifests: list[dict] = []
        blobs: dict[str, int] = {}
        for child in children(top):
            sub = registry.manifest(ref.repository, child["digest"])
            manifests.append(self._store_manifest(sub))
            blobs.update({b["digest"]: b["size"] for b in blobs_of(sub)})
        manifests.append(self._store_manifest(top))
        blobs.update({b["digest"]: b["size"] for b in blobs_of(top)})
        for digest, size in blobs.items():
            self._queue_blob(registry, ref.repository, digest, size)
        return Artifact("image", str(ref), ref.mirror_repository, ref.tag, top.digest, top.media_type,
                        manifests, [{"digest": d, "size": s} for d, s in blobs.items()])

    # -- packages ----------------------------------------------------------------
    def _package(self, package: packages.PackageFile) -> Artifact:
        blob = self.bundle.store(package.path.read_bytes())
        self.progress(f"package {package.ref} ({blob['size'] / 1e6:.1f} MB)")
        return Artifact("package", package.ref, f"packages/{package.os}", package.path.name, blob["digest"],
                        packages.DEB, [], [blob])

    # -- charts ------------------------------------------------------------------
    def _chart(self, chart: PlannedChart) -> Artifact:
        tag = chart.version.replace("+", "_")  # OCI tags cannot hold '+' (Helm's own rule)
        if chart.repository.startswith("oci://"):
            host, _, path = chart.repository.removeprefix("oci://").partition("/")
            source = ImageRef(host, f"{path}/{chart.name}".strip("/"), tag, chart.digest)
            artifact = self._image(source)
            artifact.kind, artifact.ref, artifact.repository = "chart", str(chart), chart.mirror_repository
            return artifact
        return chart_artifact(self.bundle, chart, self._helm_repo_archive(chart))

    def _helm_repo_archive(self, chart: PlannedChart) -> bytes:
        base = self.sources.url(chart.repository).rstrip("/")
        index = yaml.safe_load(_get(f"{base}/index.yaml", self.sources.ssl_context())) or {}
        entries = [e for e in index.get("entries", {}).get(chart.name, []) if str(e.get("version")) == chart.version]
        if not entries:
            raise MirrorError(f"chart {chart}: version {chart.version} is not in {chart.repository}/index.yaml")
        entry = entries[0]
        url = urllib.parse.urljoin(base + "/", entry["urls"][0])
        url = self.sources.url(url) if url.startswith("http") else url
        archive = _get(url, self.sources.ssl_context())
        expected = entry.get("digest")
        if expected and hashlib.sha256(archive).hexdigest() != expected:
            raise MirrorError(f"chart {chart}: the archive's sha256 does not match the repository index")
        if chart.digest and sha256_digest(archive) != chart.digest:
            raise MirrorError(f"chart {chart}: the archive does not match the digest pinned in the release")
        return archive


def chart_artifact(bundle: Bundle, chart: PlannedChart, archive: bytes) -> Artifact:
    """A chart archive (.tgz) stored as Helm stores it in a registry: an OCI manifest whose
    config is Chart.yaml as JSON and whose one layer is the archive."""
    meta = _chart_metadata(archive, chart)
    config = bundle.store(json.dumps(meta, sort_keys=True, separators=(",", ":")).encode())
    layer = bundle.store(archive)
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": {"mediaType": HELM_CONFIG, **config},
                       "layers": [{"mediaType": HELM_CONTENT, **layer}]},
                      sort_keys=True, separators=(",", ":")).encode()
    manifest = {**bundle.store(body), "media_type": OCI_MANIFEST}
    return Artifact("chart", str(chart), chart.mirror_repository, chart.version.replace("+", "_"),
                    manifest["digest"], OCI_MANIFEST, [manifest], [config, layer])


def _get(url: str, context: ssl.SSLContext) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=120, context=context) as response:
            return response.read()
    except (OSError, ValueError) as exc:
        raise MirrorError(f"cannot fetch {url}: {exc}") from None


def _chart_metadata(archive: bytes, chart: PlannedChart) -> dict:
    """Chart.yaml as JSON: what Helm stores as the config of a chart in a registry."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        member = next((m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/Chart.yaml")), None)
        if member is None:
            raise MirrorError(f"chart {chart}: the archive has no Chart.yaml")
        meta = yaml.safe_load(tar.extractfile(member).read())  # type: ignore[union-attr]
    if meta.get("name") != chart.name or str(meta.get("version")) != chart.version:
        raise MirrorError(f"chart {chart}: the archive holds {meta.get('name')} {meta.get('version')}")
    return meta
