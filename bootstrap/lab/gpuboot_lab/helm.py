"""`gpuboot lab helm build|path`: a real helm for the control machine, built from its Go
module (no release downloads exist here). gpuboot renders add-on charts with `helm template`
on the control machine; in production the operator brings helm, in the lab it is this one.

Cached by module version and Go version under ~/.cache/gpuboot/helm: built once (about 8 min
cold on 2 cores), then found."""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpuboot_lab.errors import LabError
from gpuboot_lab.locks import build_once

MODULE = "helm.sh/helm/v3"
VERSION = "v3.22.0"
DEFAULT_CACHE = Path.home() / ".cache" / "gpuboot" / "helm"


class HelmBuild:
    def __init__(self, cache_dir: Path = DEFAULT_CACHE, log: Callable[[str], None] = print) -> None:
        self.cache_dir, self.log = cache_dir, log

    def _go_version(self) -> str:
        return subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()

    def binary(self, version: str = VERSION) -> Path:
        return self.cache_dir / f"{version}-{self._go_version()}" / "bin" / "helm"

    def path(self, version: str = VERSION) -> Path:
        binary = self.binary(version)
        if not binary.is_file():
            raise LabError(f"helm {version} is not built", hint="run: gpuboot lab helm build")
        return binary

    def build(self, version: str = VERSION) -> Path:
        binary = self.binary(version)
        build_once(binary.parent.parent, f"helm {version}", binary.is_file, lambda: self._build(version), self.log)
        return binary

    def _build(self, version: str) -> Path:
        binary = self.binary(version)
        bin_dir = binary.parent
        bin_dir.mkdir(parents=True, exist_ok=True)
        log_file = bin_dir.parent / "build.log"
        self.log(f"helm {version}: building from {MODULE} (log {log_file})")
        started = time.monotonic()
        env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=mod", GOBIN=str(bin_dir),
                   GOMODCACHE=str(self.cache_dir / "gomodcache"), GOCACHE=str(self.cache_dir / "gocache"))
        with log_file.open("w") as log:
            proc = subprocess.run(["go", "install", "-trimpath", "-ldflags",
                                   f"-s -w -X helm.sh/helm/v3/internal/version.version={version}",
                                   f"{MODULE}/cmd/helm@{version}"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
        if proc.returncode != 0 or not binary.is_file():
            raise LabError(f"building helm {version} failed", hint=f"see {log_file}")
        self.log(f"helm {version}: built in {time.monotonic() - started:.0f} s: {binary}")
        return binary
