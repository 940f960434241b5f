"""`gpuboot gitops`: the repository Argo CD takes the cluster over from."""
from __future__ import annotations

from pathlib import Path

import click

from gpuboot.cli.core import App, cli, inventory_arg, pass_app
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


@gitops.command("diff")
@inventory_arg
@click.option("--exit-code", is_flag=True, help="Exit 1 when the repository would change (for CI).")
@pass_app
def gitops_diff(app: App, inventory: str, exit_code: bool) -> None:
    """Show what a render of the inventory now would change in the repository Git holds.

    After the GitOps handoff Git owns the cluster's directory and gpuboot never pushes over it:
    commit this change (with review) to apply the inventory's new tenants or add-on settings."""
    from gpuboot.errors import GitOpsError
    from gpuboot.gitops.diff import diff
    cluster = load_cluster(inventory)
    result = diff(cluster)
    where = f"{cluster.settings.gitops.repo_url} {cluster.settings.gitops.branch}" + (
        f" at {result.commit[:12]}" if result.commit else " (no such branch yet)")
    if not result.changed:
        app.console.print(f"[green]no difference[/]: {result.directory} in {where} is what the inventory renders")
        return
    click.echo(result.text, nl=False)
    app.console.print(f"[yellow]{len(result.changed)} file(s) differ[/] between {result.directory} in {where} "
                      "and what the inventory renders (- Git, + inventory)")
    if exit_code:
        raise GitOpsError(f"{len(result.changed)} file(s) of {result.directory} differ from the inventory's render")
