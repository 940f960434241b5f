"""Argo CD for the lab's mirror: its images built from the Go module (real: gpuboot_lab.argocd)
and the TEST DOUBLE of the argo-helm argo-cd chart (tests/doubles/charts/argo-cd), whose
objects are made here from Argo CD's own manifests/install.yaml at the matrix's version:

- images and namespace become the values and release namespace the real chart takes them from;
- the ConfigMaps gpuboot configures come from the double's templates/configs.yaml instead;
- Dex is left out (its image cannot be built here; gpuboot's values turn it off);
- text that looks like a Helm template is escaped so that helm passes it through.

Both are added to a lab bundle, entering the mirror as `gpuboot mirror import` brings the real
ones in."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from gpuboot import matrix
from gpuboot.mirror.bundle import Bundle
from gpuboot.mirror.plan import PlannedChart
from gpuboot.mirror.pull import chart_artifact
from gpuboot_lab import argocd as lab_argocd

CHART = Path(__file__).resolve().parents[1] / "doubles" / "charts" / "argo-cd"
CLUSTER_SCOPED = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
FROM_CONFIGS = {"argocd-ssh-known-hosts-cm", "argocd-tls-certs-cm", "argocd-cm", "argocd-cmd-params-cm"}
TOKENS = {"@@ARGOCD_IMAGE@@": "{{ .Values.global.image.repository }}:{{ .Values.global.image.tag }}",
          "@@REDIS_IMAGE@@": "{{ .Values.redis.image.repository }}:{{ .Values.redis.image.tag }}",
          "@@NAMESPACE@@": "{{ .Release.Namespace }}"}


def _swap_images(node):
    if isinstance(node, dict):
        return {key: (_image_token(value) if key == "image" and isinstance(value, str) else _swap_images(value))
                for key, value in node.items()}
    if isinstance(node, list):
        return [_swap_images(item) for item in node]
    return node


def _image_token(image: str) -> str:
    if "/argocd:" in image:
        return "@@ARGOCD_IMAGE@@"
    if image.startswith("redis:") or "/redis:" in image:
        return "@@REDIS_IMAGE@@"
    raise AssertionError(f"install.yaml names an image the double does not map: {image}")


def upstream_template(install_yaml: str) -> str:
    kept = []
    for doc in yaml.safe_load_all(install_yaml):
        if not doc:
            continue
        name = doc["metadata"]["name"]
        if name in FROM_CONFIGS or "dex" in name:
            continue
        if doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = "@@NAMESPACE@@"
        for subject in doc.get("subjects") or []:
            if "namespace" in subject:
                subject["namespace"] = "@@NAMESPACE@@"
        kept.append(_swap_images(doc))
    text = "---\n".join(yaml.safe_dump(doc, sort_keys=False) for doc in kept)
    # Escape what helm would read as its own template, then put the double's expressions in.
    text = text.replace("{{", "\x00open\x00").replace("}}", "\x00close\x00")
    text = text.replace("\x00open\x00", '{{ "{{" }}').replace("\x00close\x00", '{{ "}}" }}')
    for token, expression in TOKENS.items():
        text = text.replace(token, expression)
    return "# TEST DOUBLE: made from Argo CD's manifests/install.yaml by tests/support/argocd_chart.py\n" + text


def package(helm: Path, version: str, chart_version: str, out: Path) -> bytes:
    """The double chart with Argo CD VERSION's objects, packaged by helm at CHART_VERSION."""
    work = out / "argo-cd"
    shutil.copytree(CHART, work)
    (work / "templates" / "upstream.yaml").write_text(
        upstream_template(lab_argocd.install_manifest(version).read_text()))
    proc = subprocess.run([str(helm), "package", str(work), "--version", chart_version, "--app-version", version,
                           "--destination", str(out)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return next(out.glob("argo-cd-*.tgz")).read_bytes()


def add_to_bundle(bundle_dir: Path, release_name: str, helm: Path) -> list[str]:
    """Add Argo CD's images (built) and chart (the double) to the bundle; return the image refs."""
    entry = matrix.entry(release_name)
    version, chart, refs = entry["argocd"]["version"], entry["argocd"]["chart"], entry["images"]["argocd"]
    bundle = Bundle(bundle_dir)
    name, artifacts = bundle.read_manifest()
    added = lab_argocd.images(bundle, version, refs, helm, log=lambda message: None)
    with tempfile.TemporaryDirectory() as tmp:
        archive = package(helm, version, str(chart["version"]), Path(tmp))
        added.append(chart_artifact(bundle, PlannedChart("argocd", chart["repository"], chart["name"],
                                                         str(chart["version"])), archive))
    known = {a.ref for a in added}
    bundle.write_manifest(name, [a for a in artifacts if a.ref not in known] + added)
    return [a.ref for a in added if a.kind == "image"]
