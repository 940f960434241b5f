"""`gpuboot gitops`: the repository Argo CD takes the cluster over from."""
from __future__ import annotations

from pathlib import Path

import click

from gpuboot.cli.main import App, cli, inventory_arg, pass_app
from gpuboot.config.loader import load_cluster


@cli.group()
def gitops() -> None:
    """The GitOps repository: the add-ons `up` installed and the tenants' bundles."""


@gitops.command("render")
@inventory_arg
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="The repository's root (a clone); gpuboot.gitops.path inside it is rewritten.")
@pass_app
def gitops_render(app: App, inventory: str, out: str) -> None:
    """Write the cluster's GitOps repository, touching no host."""
    from gpuboot.gitops.repo import write
    cluster = load_cluster(inventory)
    files = write(cluster, Path(out))
    for path in files:
        app.console.print(f"  {path.relative_to(Path(out))}")
    app.console.print(f"[green]rendered[/] {len(files)} files of cluster {cluster.settings.cluster_name} "
                      f"under {Path(out) / cluster.settings.gitops.directory(cluster.settings.cluster_name)}")
