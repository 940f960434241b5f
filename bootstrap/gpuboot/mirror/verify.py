"""Check a registry against a plan: every image and chart there under its tag, at its
pinned digest when there is one, with every child manifest and blob present."""
from __future__ import annotations

import os
import ssl
import urllib.request
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


def verify_packages(plan: Plan, packages_url: str, ca_file: str | None = None) -> list[Finding]:
    """Every planned package in the mirror's apt repository for its OS (<url>/<os id>/Packages)."""
    findings: list[Finding] = []
    context = ssl.create_default_context(cafile=ca_file)
    for os_id in sorted({p.os for p in plan.packages}):
        url = f"{packages_url.rstrip('/')}/{os_id}/Packages"
        try:
            with urllib.request.urlopen(url, timeout=30, context=context) as response:
                index = response.read().decode("utf-8", "replace")
        except (OSError, ValueError) as exc:
            findings.append(Finding(f"{os_id} packages", f"repository index {url} unreadable ({exc})"))
            continue
        have = set()
        for stanza in index.split("\n\n"):
            fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
            if "Package" in fields:
                have.add((fields["Package"], fields.get("Version", "")))
        names = {name for name, _ in have}
        for package in (p for p in plan.packages if p.os == os_id):
            present = (package.name, package.version) in have if package.version else package.name in names
            if not present:
                findings.append(Finding(str(package), f"not in the mirror's repository {url.rsplit('/', 1)[0]}/"))
    return findings


def require_complete(plan: Plan, registry: Registry, packages_url: str | None = None,
                     ca_file: str | None = None, images: bool = True) -> None:
    """The air-gap preflight: fail naming every missing artifact (images and charts unless
    images is False; packages when a repository URL is given)."""
    findings = verify(plan, registry) if images else []
    if packages_url:
        findings += verify_packages(plan, packages_url, ca_file)
    if findings:
        raise MirrorError(f"the mirror {registry.netloc} lacks {len(findings)} artifact(s) release "
                          f"{plan.release} needs:\n  " + "\n  ".join(str(f) for f in findings),
                          hint="import a bundle that has them: `gpuboot mirror import BUNDLE --registry "
                               f"{registry.netloc}` (make it with `gpuboot mirror pull` on the connected side)")
