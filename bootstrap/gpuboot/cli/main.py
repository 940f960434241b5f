"""The gpuboot command line. Parses options, calls the core, renders; maps typed errors
to exit codes in exactly one place (main)."""
from __future__ import annotations

import json
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import click

from gpuboot.cli.core import App, cli, inventory_arg, mirror_preflight, pass_app, run_phases
from gpuboot.config.loader import load_cluster
from gpuboot.errors import GpubootError, Interrupted, UsageError
from gpuboot.phases.catalog import UP
from gpuboot.phases.select import Selection, select

# `render` lists files one by one up to this many; beyond, it says how many.
RENDER_LISTED_FILES = 200


@cli.command()
@inventory_arg
@click.option("--check-files/--skip-files", default=True, show_default=True,
              help="Check that the key, CA and credential files the inventory names exist and that secrets "
                   "are private; --skip-files validates away from the secrets (e.g. in a review pipeline).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def validate(app: App, inventory: str, check_files: bool, output: str) -> None:
    """Check an inventory completely, without touching any host."""
    cluster = load_cluster(inventory, check_files=check_files)
    if output == "json":
        click.echo(json.dumps({"valid": True, "cluster": cluster.settings.cluster_name,
                               "nodes": len(cluster.nodes)}))
        return
    roles: dict[str, int] = {}
    for node in cluster.cluster_nodes:
        roles[node.role] = roles.get(node.role, 0) + 1
    summary = ", ".join(f"{count} {role.replace('_', ' ')}" for role, count in sorted(roles.items()))
    app.console.print(f"[green]valid[/] {inventory}: cluster {cluster.settings.cluster_name}, "
                      f"release {cluster.settings.release}, {summary}")


def _selection_options(func):
    for decorator in reversed([
        click.option("--from", "from_phase", metavar="PHASE", help="Start at this phase."),
        click.option("--to", "to_phase", metavar="PHASE", help="Stop after this phase."),
        click.option("--only", multiple=True, metavar="PHASE", help="Run only these phases (repeatable)."),
        click.option("--skip", multiple=True, metavar="PHASE", help="Leave out these phases (repeatable)."),
    ]):
        func = decorator(func)
    return func


@cli.command()
@inventory_arg
@_selection_options
@click.option("--check", is_flag=True, help="Run Ansible in check mode with diff against the hosts.")
@click.option("--insecure-skip-host-key-check", is_flag=True, help="Turn SSH host-key checking off (logged).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def plan(app: App, inventory: str, from_phase, to_phase, only, skip, check: bool,
         insecure_skip_host_key_check: bool, output: str) -> None:
    """Show, per phase and host, what `up` would run."""
    from gpuboot.phases.planning import describe
    cluster = load_cluster(inventory)
    phases = select(UP, Selection(from_phase, to_phase, tuple(only), tuple(skip)))
    state = app.cluster_state(cluster)
    rows = describe(cluster, phases, state)
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        for row in rows:
            app.console.print(f"[bold]{row['phase']}[/] ({row['title']}) -> {row['playbook']}: {row['action']}")
            for host in row["hosts"]:
                app.console.print(f"    {host}")
            for node, lines in row.get("demands", {}).items():
                app.console.print(f"    demands of {node}: " + "; ".join(lines), markup=False)
            for note in row.get("notes", []):
                app.console.print(f"    {note}", markup=False)
    if check:
        run_phases(app, cluster, phases, output, check=True, diff=True, force=True,
             host_key_checking=not insecure_skip_host_key_check, command="plan --check")


@cli.command()
@inventory_arg
@_selection_options
@click.option("--force", is_flag=True, help="Run phases even when they are up to date.")
@click.option("--insecure-skip-host-key-check", is_flag=True, help="Turn SSH host-key checking off (logged).")
@click.option("--skip-mirror-check", is_flag=True,
              help="Do not check, before image-pulling phases, that the air-gap mirror holds every artifact (logged).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@click.option("-v", "--verbose", count=True, help="More Ansible detail in the run's stdout artifact.")
@pass_app
def up(app: App, inventory: str, from_phase, to_phase, only, skip, force: bool,
       insecure_skip_host_key_check: bool, skip_mirror_check: bool, output: str, verbose: int) -> None:
    """Bring a cluster to the desired state. Safe to re-run: that is the resume."""
    cluster = load_cluster(inventory, check_files=True)
    phases = select(UP, Selection(from_phase, to_phase, tuple(only), tuple(skip)))
    mirror_preflight(app, cluster, phases, skip_mirror_check)
    run_phases(app, cluster, phases, output, check=False, diff=False, force=force,
         host_key_checking=not insecure_skip_host_key_check, command="up", verbosity=verbose)


@cli.command()
@inventory_arg
@click.option("--insecure-skip-host-key-check", is_flag=True, help="Turn SSH host-key checking off (logged).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def verify(app: App, inventory: str, insecure_skip_host_key_check: bool, output: str) -> None:
    """Check the running cluster against the inventory (the validate phase on its own): GPU
    resources per node, the GPU Operator and its operands, smoke Jobs, Calico, pod network."""
    cluster = load_cluster(inventory, check_files=True)
    report = app.cluster_state(cluster).root / "validate.json"
    report.unlink(missing_ok=True)  # what is printed below is this run's, or nothing
    try:
        run_phases(app, cluster, select(UP, Selection(None, None, ("validate",), ())), output, check=False, diff=False,
             force=True, host_key_checking=not insecure_skip_host_key_check, command="verify")
    finally:
        if report.is_file():
            _print_report(app, json.loads(report.read_text()), output)


def _print_report(app: App, report: dict, output: str) -> None:
    if output == "json":
        click.echo(json.dumps({"event": "ValidationReport", **report}))
        return
    from rich.table import Table
    table = Table(title=f"cluster {report['cluster']}: {report['short']} check(s) short")
    for column in ("node", "check", "want", "got", "ok", "reason"):
        table.add_column(column)
    for row in report["rows"]:
        table.add_row(row["node"], row["check"], str(row["want"]), str(row["got"]),
                      "[green]ok[/]" if row["ok"] else "[red]SHORT[/]", row["reason"])
    app.console.print(table)


@cli.command()
@inventory_arg
@click.option("--phase", "phases", multiple=True, metavar="PHASE", help="Render only these phases (repeatable).")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Directory to write into.")
@pass_app
def render(app: App, inventory: str, phases: tuple[str, ...], out: str) -> None:
    """Write every configuration file the phases would produce, touching no host."""
    from gpuboot.phases.render import render as render_files
    cluster = load_cluster(inventory)
    files = render_files(cluster, Path(out), phases)
    root = Path(out).resolve()
    # A list a person reads; for a large fleet the directory is the list.
    if len(files) <= RENDER_LISTED_FILES:
        for path in files:
            app.console.print(f"  {path.relative_to(root)}")
    hosts = len({path.relative_to(root).parts[0] for path in files})
    app.console.print(f"[green]rendered[/] {len(files)} files for {hosts - 1} hosts into {out}")


@cli.command()
@inventory_arg
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def status(app: App, inventory: str, output: str) -> None:
    """Show the last runs and what each phase did."""
    cluster = load_cluster(inventory)
    data = app.cluster_state(cluster).load()
    if output == "json":
        click.echo(json.dumps(data, indent=2))
        return
    app.console.print(f"[bold]cluster {cluster.settings.cluster_name}[/]")
    for phase in UP:
        rec = data["phases"].get(phase.name)
        text = f"{rec['status']} at {rec['at']} (run {rec['run_id']}, {rec['changed']} changed)" if rec else "never run"
        app.console.print(f"  {phase.name:20} {text}")
    for run in data["runs"][-10:]:
        app.console.print(f"  run {run['run_id']}: {run['command']} {run['status']} "
                          f"({', '.join(run['phases']) or 'no phases run'}; {run['seconds']}s)")


def _wants_json(argv: list[str]) -> bool:
    return any(a == "--output=json" or (a == "--output" and i + 1 < len(argv) and argv[i + 1] == "json")
               for i, a in enumerate(argv))


def _error_json(exc: Exception, code: int) -> str:
    """An error as JSON on stdout (`--output json`): the last line of a run's event stream,
    or the one document of a command that prints a document."""
    body: dict = {"event": "Error", "error": {"kind": type(exc).__name__, "exit_code": code,
                            "message": getattr(exc, "message", str(exc)), "fix": getattr(exc, "hint", None)}}
    problems = getattr(exc, "problems", None)
    if problems:
        body["error"]["problems"] = [{"file": p.file, "line": p.line, "path": p.path, "message": p.message,
                                      "fix": p.fix} for p in problems]
    return json.dumps(body)


@cli.command()
@inventory_arg
@click.option("--yes-the-run-is-gone", "confirmed", is_flag=True,
              help="Confirm that the run holding the lock is not running any more.")
@pass_app
def unlock(app: App, inventory: str, confirmed: bool) -> None:
    """Remove the cluster lock on the first control plane left by a run that died."""
    from gpuboot.phases.engine import unlock_cluster
    if not confirmed:
        raise UsageError("unlock removes another run's lock: only when that run is gone",
                         hint=f"gpuboot unlock {inventory} --yes-the-run-is-gone")
    cluster = load_cluster(inventory, check_files=True)
    holder = unlock_cluster(cluster, app.cluster_state(cluster))
    app.console.print(f"unlocked cluster {cluster.settings.cluster_name}" +
                      (f" (was held by {holder})" if holder else " (it was not locked)"))


def _add_plugin_commands() -> None:
    """Command groups other packages add (the lab's `gpuboot lab`), by the entry-point group
    gpuboot.commands: the product never imports them by name."""
    from importlib.metadata import entry_points
    for point in entry_points(group="gpuboot.commands"):
        if point.name not in cli.commands:
            cli.add_command(point.load(), point.name)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, `timeout`, systemd stopping a unit) or SIGHUP (the terminal or the
    SSH session closed): handled as Ctrl-C is, so the running ansible-playbook and its workers
    are stopped, the lock given back and the run recorded as interrupted."""


# Signals that end a run as an interrupt; the exit code is 128 + the signal, as a shell reports it.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
TERMINATED: list[int] = []  # the signal that ended this run, if one did


@contextmanager
def stop_signals_as_interrupt():
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        TERMINATED.append(signum)
        raise Terminated()

    previous = {signum: signal.signal(signum, terminate) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code: the one place typed errors become codes."""
    import gpuboot.cli.day2  # noqa: F401  (registers `gpuboot upgrade`)
    import gpuboot.cli.gitops  # noqa: F401  (registers `gpuboot gitops`)
    import gpuboot.cli.mirror  # noqa: F401  (registers `gpuboot mirror`)
    _add_plugin_commands()
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = _wants_json(args)

    def report(exc: Exception, code: int, text: str) -> int:
        try:
            if as_json:
                click.echo(_error_json(exc, code))
            else:
                click.echo(text, err=True)
        except OSError:
            pass  # after SIGHUP the terminal may be gone; the run record has the outcome
        return code

    def terminated(exc: BaseException) -> int:
        return report(exc, 128 + TERMINATED[0], f"terminated ({signal.Signals(TERMINATED[0]).name})")

    TERMINATED.clear()
    try:
        with stop_signals_as_interrupt():
            result = cli.main(args=args, prog_name="gpuboot", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Abort as exc:
        # click turns a KeyboardInterrupt (and so a Terminated) raised in a command into Abort.
        if TERMINATED:
            return terminated(exc)
        return report(exc, 130, "aborted")
    except click.ClickException as exc:
        if as_json:
            return report(exc, exc.exit_code, "")
        exc.show()
        return exc.exit_code
    except GpubootError as exc:
        # A signal that ended a run arrives as the run's Interrupted: 128 + its number (143 for
        # SIGTERM, 129 for SIGHUP), as a shell reports it.
        code = 128 + TERMINATED[0] if isinstance(exc, Interrupted) and TERMINATED else exc.exit_code
        return report(exc, code, f"error: {exc}")
    except Terminated as exc:
        return terminated(exc)
    except KeyboardInterrupt as exc:
        return report(exc, 130, "interrupted")


def main() -> None:
    sys.exit(run())
