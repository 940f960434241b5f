"""Argo CD's own source, from its Go module (no release downloads exist here): its CRDs, so
the lab's API server judges the Applications and AppProjects gpuboot writes by Argo CD's real
schema. Cached under ~/.cache/gpuboot/argocd by module version (about 10 s cold)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from gpuboot_lab.errors import LabError

MODULE = "github.com/argoproj/argo-cd/v3"
DEFAULT_CACHE = Path.home() / ".cache" / "gpuboot" / "argocd"


def source(version: str, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The module's tree at VERSION (read-only, in the module cache)."""
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod", GOMODCACHE=str(cache_dir / "gomodcache"))
    proc = subprocess.run(["go", "mod", "download", "-json", f"{MODULE}@{version}"], env=env,
                          capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise LabError(f"could not download {MODULE}@{version}: {proc.stdout[-500:]}{proc.stderr[-500:]}",
                       hint="the Go module proxy must be reachable (GOPROXY)")
    return Path(json.loads(proc.stdout)["Dir"])


def crds(version: str, cache_dir: Path = DEFAULT_CACHE) -> list[Path]:
    directory = source(version, cache_dir) / "manifests" / "crds"
    found = sorted(p for p in directory.glob("*-crd.yaml"))
    if not found:
        raise LabError(f"{MODULE}@{version} has no CRDs under manifests/crds")
    return found
