"""Finds the shipped Ansible content (playbooks/, roles/, mirror/).

A wheel carries it as package data under gpuboot/_content; a source checkout has it at
the repository root. GPUBOOT_CONTENT_DIR overrides both (for testing a content change
without reinstalling)."""
from __future__ import annotations

import os
from functools import cache
from importlib import resources
from pathlib import Path

from gpuboot.errors import GpubootError

ENV_VAR = "GPUBOOT_CONTENT_DIR"


def _is_content(path: Path) -> bool:
    return (path / "playbooks").is_dir() and (path / "roles").is_dir() and (path / "mirror").is_dir()


@cache
def _locate(override: str | None) -> Path:
    if override:
        path = Path(override).expanduser().resolve()
        if not _is_content(path):
            raise GpubootError(f"{ENV_VAR}={override} has no playbooks/, roles/ and mirror/",
                               hint=f"point {ENV_VAR} at a gpuboot checkout, or unset it")
        return path
    packaged = Path(str(resources.files("gpuboot"))) / "_content"
    if _is_content(packaged):
        return packaged
    checkout = Path(__file__).resolve().parents[2]
    if _is_content(checkout):
        return checkout
    raise GpubootError("gpuboot's playbooks and roles are missing from this installation",
                       hint="reinstall gpuboot, or set GPUBOOT_CONTENT_DIR")


def content_dir() -> Path:
    return _locate(os.environ.get(ENV_VAR) or None)


def playbook(name: str) -> Path:
    return content_dir() / "playbooks" / name


def releases_dir() -> Path:
    return content_dir() / "mirror" / "releases"
