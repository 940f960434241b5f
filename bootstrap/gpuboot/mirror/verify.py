"""Check a registry against a plan: every image and chart there under its tag, at its
pinned digest when there is one, with every child manifest and blob present."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpuboot.errors import MirrorError
from gpuboot.mirror.plan import Plan
from gpuboot.mirror.registry import Registry, blobs_of, children


@dataclass(frozen=True)
class Finding:
    artifact: str
    problem: str

    def __str__(self) -> str:
        return f"{self.artifact}: {self.problem}"


def _check(registry: Registry, label: str, repository: str, tag: str, pinned: str | None) -> list[Finding]:
    digest = registry.manifest_digest(repository, tag)
    if digest is None:
        return [Finding(label, "not in the mirror")]
    if pinned and digest != pinned:
        return [Finding(label, f"tag points at {digest}, the release pins {pinned}")]
    top = registry.manifest(repository, digest)
    found: list[Finding] = []
    manifests = [top]
    for child in children(top):
        if registry.manifest_digest(repository, child["digest"]) is None:
            found.append(Finding(label, f"child manifest {child['digest']} is missing"))
        else:
            manifests.append(registry.manifest(repository, child["digest"]))
    for manifest in manifests:
        for blob in blobs_of(manifest):
            if not registry.has_blob(repository, blob["digest"]):
                found.append(Finding(label, f"blob {blob['digest']} is missing"))
    return found


def verify(plan: Plan, registry: Registry) -> list[Finding]:
    checks = [(str(i.ref), i.ref.mirror_repository, i.ref.tag, i.ref.digest) for i in plan.images]
    checks += [(str(c), c.mirror_repository, c.version.replace("+", "_"), None) for c in plan.charts]
    with ThreadPoolExecutor(max(4, (os.cpu_count() or 2) * 2)) as pool:
        results = list(pool.map(lambda args: _check(registry, *args), checks))
    return [finding for found in results for finding in found]


def require_complete(plan: Plan, registry: Registry) -> None:
    """The air-gap preflight: fail naming every missing artifact."""
    findings = verify(plan, registry)
    if findings:
        raise MirrorError(f"the mirror {registry.netloc} lacks {len(findings)} artifact(s) release "
                          f"{plan.release} needs:\n  " + "\n  ".join(str(f) for f in findings),
                          hint="import a bundle that has them: `gpuboot mirror import BUNDLE --registry "
                               f"{registry.netloc}` (make it with `gpuboot mirror pull` on the connected side)")
