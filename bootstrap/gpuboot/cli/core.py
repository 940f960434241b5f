"""What every gpuboot command shares: the App (consoles, where state lives), the click group
and its decorators, running phases through the engine, and the air-gap check before them.
Command modules import this; nothing here imports a command module."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from gpuboot import __version__
from gpuboot.state import ClusterState, state_root


class App:
    def __init__(self, state_dir: str | None) -> None:
        self.explicit_state_dir = state_dir
        # The lab's own files (no inventory yet): --state-dir, GPUBOOT_STATE_DIR or ./.gpuboot.
        self.state_dir = state_root(state_dir)
        # Never wrap: output to a pipe or a file keeps each message on its line.
        self.console = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    def cluster_state(self, cluster) -> ClusterState:
        """A cluster's state lives beside its inventory (<inventory dir>/.gpuboot/<cluster>), so
        every operator using that inventory, from any directory, shares runs and the lock;
        --state-dir or GPUBOOT_STATE_DIR moves the root."""
        root = state_root(self.explicit_state_dir, default=Path(cluster.inventory).resolve().parent / ".gpuboot")
        return ClusterState.for_cluster(root, cluster.settings.cluster_name)


pass_app = click.make_pass_decorator(App)
inventory_arg = click.argument("inventory", type=click.Path(dir_okay=False))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuboot")
@click.option("--state-dir", envvar="GPUBOOT_STATE_DIR", default=None,
              help="Where runs and state are kept (default: .gpuboot beside the inventory).")
@click.pass_context
def cli(ctx: click.Context, state_dir: str | None) -> None:
    """Bare-metal GPU Kubernetes clusters from an Ansible inventory."""
    ctx.obj = App(state_dir)


def mirror_preflight(app: App, cluster, phases, skip: bool) -> None:
    """Air gap: every artifact the cluster needs is in the mirror before a node pulls."""
    from gpuboot.mirror.preflight import check_mirror, needed
    if not needed(cluster, phases):
        return
    if skip:
        app.err.print("[yellow]warning: the air-gap mirror was not checked (--skip-mirror-check)[/]")
        return
    count = check_mirror(cluster, phases)
    app.err.print(f"mirror {cluster.settings.mirror.registry} holds all {count} artifacts these phases need")


def run_phases(app: App, cluster, phases, output: str, *, check: bool, diff: bool, force: bool,
         host_key_checking: bool, command: str, verbosity: int = 0, extravars: dict | None = None,
         resume_hint: str | None = None, limit: tuple[str, ...] = (), unlimited: tuple[str, ...] = ()) -> None:
    from gpuboot.phases.engine import Engine, RunOptions, raise_for
    from gpuboot.ui.console import ConsoleProgress, JsonLines
    if not host_key_checking:
        app.err.print("[yellow]warning: SSH host-key checking is OFF for this run "
                      "(--insecure-skip-host-key-check)[/]")
    sink = JsonLines() if output == "json" else ConsoleProgress(app.console)
    state = app.cluster_state(cluster)
    options = RunOptions(command=command, check=check, diff=diff, force=force,
                         host_key_checking=host_key_checking, verbosity=verbosity, extravars=extravars or {},
                         limit=limit, unlimited=unlimited,
                         **({"resume_hint": resume_hint} if resume_hint else {}))
    finished = Engine(cluster, state, options, sink).run(phases)
    raise_for(finished)


def register(command: click.Command) -> None:
    cli.add_command(command)
