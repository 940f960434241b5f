"""The air-gap preflight of `up` and `upgrade`: before any phase whose nodes pull images
runs, the mirror must hold every artifact the plan for this inventory needs."""
from __future__ import annotations

from pathlib import Path

from gpuboot import matrix
from gpuboot.config.checks import resolve_path
from gpuboot.config.model import Cluster
from gpuboot.mirror.plan import Target, build
from gpuboot.mirror.registry import Registry, read_credentials
from gpuboot.mirror.verify import require_complete


def _path(value: str | None, cluster: Cluster) -> str | None:
    return str(resolve_path(value, Path(cluster.inventory).parent)) if value else None


def needed(cluster: Cluster, phases) -> bool:
    return cluster.settings.mirror.air_gapped and any(p.pulls_for(cluster) or p.installs_packages for p in phases)


def check_mirror(cluster: Cluster, phases, releases_dir: Path | None = None) -> int:
    """Raise MirrorError naming every missing artifact the phases need; return how many were checked."""
    mirror = cluster.settings.mirror
    # Only what the selected phases consume: node preparation alone needs no images.
    components = {c for p in phases for c in p.pulls_for(cluster)}
    release = matrix.load(cluster.settings.release, releases_dir)
    plan = build(release, Target.of(cluster, release)).only(components)
    registry = Registry(f"https://{mirror.registry}", ca_file=_path(mirror.ca_file, cluster),
                        credentials=read_credentials(_path(mirror.credentials_file, cluster)))
    wants_images = bool(components)
    wants_packages = bool(any(p.installs_packages for p in phases) and mirror.packages_url)
    require_complete(plan, registry, mirror.packages_url if wants_packages else None,
                     _path(mirror.ca_file, cluster), images=wants_images)
    return ((len(plan.images) + len(plan.charts) if wants_images else 0)
            + (len(plan.packages) if wants_packages else 0))
