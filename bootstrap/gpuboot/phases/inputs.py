"""What a phase's playbook gets beyond the cluster's own variables, by phase. Kept out of the
catalog: what provides them (the GitOps repository) is itself built from the catalog's phases."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpuboot.config.checks import resolve_path
from gpuboot.config.model import Cluster
from gpuboot.gitops.repo import Repository
from gpuboot.phases.catalog import Phase


def gitops_repository(cluster: Cluster) -> dict:
    """The handoff's repository as gpuboot renders it, and the files its push reads."""
    repository = Repository(cluster)
    files = repository.render()
    gitops, base = cluster.settings.gitops, Path(cluster.inventory).parent
    return {"gpuboot_gitops_repository": {
        "directory": str(repository.root),
        # Relative paths are the inventory's own files, as validation read them.
        "key_file": str(resolve_path(gitops.credentials_file, base)),
        "known_hosts_file": str(resolve_path(gitops.known_hosts_file, base)),
        "files": {str(path.relative_to(repository.root)): text for path, text in files.items()}}}


PROVIDERS: dict[str, Callable[[Cluster], dict]] = {"gitops_handoff": gitops_repository}


def phase_inputs(phase: Phase, cluster: Cluster) -> dict:
    provider = PROVIDERS.get(phase.name)
    return provider(cluster) if provider else {}
