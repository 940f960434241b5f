"""The known-good version matrix: mirror/releases/<name>.yml."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from gpuboot import content
from gpuboot.errors import MatrixError


class Component(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    version: str


class OsPackages(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    containerd: dict[str, str | int]
    kube_packages: Component
    kernel_headers: str
    gpu_driver_container: bool
    image_os_tag: str


class RuntimeImage(BaseModel):
    """An image an operator picks per node at run time; `image` has {placeholders}."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    component: str
    image: str
    per: list[Literal["kernel", "arch"]] = []
    when: list[Literal["gpu_driver_container", "precompiled", "rdma"]] = []


class Release(BaseModel):
    """Only the fields Python needs; the playbooks read the whole file."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    kubernetes: Component
    containerd: Component
    os: dict[str, OsPackages]
    images: dict[str, list[str]] = {}
    runtime_images: list[RuntimeImage] = []

    @property
    def supported_os(self) -> list[str]:
        return list(self.os)


def available(releases_dir: Path | None = None) -> list[str]:
    base = releases_dir or content.releases_dir()
    return sorted(p.stem for p in base.glob("*.yml"))


def entry(name: str, releases_dir: Path | None = None) -> dict:
    """A release's entry as written in the matrix (what the playbooks see as gpuboot_release)."""
    return _read(name, releases_dir)[1]


def _read(name: str, releases_dir: Path | None) -> tuple[Path, dict]:
    base = releases_dir or content.releases_dir()
    path = base / f"{name}.yml"
    if not path.is_file():
        raise MatrixError(f"release '{name}' is not in the version matrix",
                          hint=f"choose one of: {', '.join(available(base)) or '(none)'}")
    data = yaml.safe_load(path.read_text()) or {}
    body = data.get("gpuboot_release") if isinstance(data, dict) else None
    if not isinstance(body, dict):
        raise MatrixError(f"{path}: the top-level key must be gpuboot_release")
    return path, body


def load(name: str, releases_dir: Path | None = None) -> Release:
    path, body = _read(name, releases_dir)
    try:
        return Release.model_validate(body)
    except ValidationError as exc:
        raise MatrixError(f"{path}: {exc}") from None
