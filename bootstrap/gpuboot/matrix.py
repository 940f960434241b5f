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
    # Whether NVIDIA publishes a DOCA driver container for the OS (the Network Operator's ofedDriver).
    doca_driver_container: bool
    # The OS part of the driver image tags; `{version}` is the node's VERSION_ID.
    image_os_tag: str
    # The tag carries the minor (rhel9.6), so nodes must say which minor they run.
    os_minor_in_tag: bool = False


class RuntimeImage(BaseModel):
    """An image an operator picks per node at run time; `image` has {placeholders}."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    component: str
    image: str
    per: list[Literal["kernel", "arch"]] = []
    # Conditions on a node, all of which must hold: gpu_container_driver / gpu_precompiled_driver
    # (the GPU Operator deploys that kind of driver there), rdma (it has NICs for the Network
    # Operator), doca_container / doca_precompiled (rdma, without / with gpuboot.drivers.precompiled:
    # the NicClusterPolicy's forcePrecompiled).
    when: list[Literal["gpu_container_driver", "gpu_precompiled_driver", "rdma", "doca_container",
                       "doca_precompiled"]] = []


class Release(BaseModel):
    """Only the fields Python needs; the playbooks read the whole file."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    kubernetes: Component
    containerd: Component
    os: dict[str, OsPackages]
    # Per component: a list, or a mapping from the chart value that deploys each image.
    images: dict[str, list[str] | dict[str, str]] = {}
    runtime_images: list[RuntimeImage] = []
    # Releases with a tested upgrade path to this one (`gpuboot upgrade --to <this>`).
    upgrades_from: list[str] = []
    # Registries whose pulls go through the mirror: in an air gap only to it, at a connected
    # site through its pull-through caches. Releases only append (a cache's port is its place).
    upstream_registries: list[str] = []

    @property
    def supported_os(self) -> list[str]:
        return list(self.os)

    def os_for(self, os_id: str) -> tuple[str, OsPackages, str]:
        """The matrix entry of an OS as a node names it (`<id>-<VERSION_ID>`): its key, its
        packages and the OS part of its driver image tags."""
        name, _, version = os_id.partition("-")
        key = os_id if os_id in self.os else f"{name}-{version.split('.')[0]}"
        if key not in self.os:
            raise MatrixError(f"{os_id} is not supported by release {self.name}",
                              hint=f"use one of: {', '.join(self.supported_os)}")
        packages = self.os[key]
        if packages.os_minor_in_tag and "." not in version:
            raise MatrixError(f"the driver images for {key} are tagged per minor release, and {os_id} names none",
                              hint=f"write the node's VERSION_ID from /etc/os-release, e.g. {key}.6")
        return key, packages, packages.image_os_tag.format(version=version)

    def component_images(self, component: str) -> list[str]:
        refs = self.images.get(component) or []
        return list(refs.values()) if isinstance(refs, dict) else list(refs)

    @property
    def optional_components(self) -> frozenset[str]:
        """Components a cluster turns on itself (`optional: true`): planned only for those that do."""
        return frozenset(name for name, body in (self.model_extra or {}).items()
                         if isinstance(body, dict) and body.get("optional"))

    def precompiled_kernels(self, os_tag: str) -> list[str]:
        """Kernels with a published precompiled GPU driver image for this OS tag."""
        gpu = (self.model_extra or {}).get("gpu_operator") or {}
        return list((gpu.get("precompiled_kernels") or {}).get(os_tag) or [])


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
