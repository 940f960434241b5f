"""Day-2 commands: `gpuboot upgrade`, `gpuboot etcd snapshot|restore`, `gpuboot node
add|remove`, `gpuboot reset`."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import click

from gpuboot.cli.core import App, cli, inventory_arg, mirror_preflight, pass_app, run_phases
from gpuboot.config.loader import load_cluster
from gpuboot.errors import UsageError
from gpuboot.phases.catalog import ETCD_RESTORE, ETCD_SNAPSHOT, NODE_REMOVE, RESET, UPGRADE
from gpuboot.upgrade import DEFAULT_DRAIN_TIMEOUT, DEFAULT_GATE_SETTLE, DEFAULT_GATE_TIMEOUT, plan_upgrade


@cli.command()
@inventory_arg
@click.option("--to", "to_release", required=True, metavar="RELEASE",
              help="The release of the version matrix to upgrade to (e.g. k8s-1.36).")
@click.option("--plan", "show_plan", is_flag=True, help="Print every step in order, per node; touch nothing.")
@click.option("--canary", type=int, default=1, show_default=True, help="Workers upgraded first, on their own.")
@click.option("--batch", default="20%", show_default=True, help="Workers per batch after the canary: N or N%.")
@click.option("--resume", is_flag=True, help="Continue an upgrade that stopped (nodes already upgraded are gated only).")
@click.option("--drain-timeout", type=int, default=DEFAULT_DRAIN_TIMEOUT, show_default=True,
              help="Seconds a node's drain may take before the node is uncordoned and the run stops.")
@click.option("--gate-timeout", type=int, default=DEFAULT_GATE_TIMEOUT, show_default=True,
              help="Seconds an upgraded node has to pass its gate.")
@click.option("--gate-settle", type=int, default=DEFAULT_GATE_SETTLE, show_default=True,
              help="Seconds a node's gate must hold without a problem before it passes.")
@click.option("--driver-timeout", type=int, default=None,
              help="Seconds the GPU Operator has to move every GPU node's driver, where the release changes it "
                   "[default: 900 per round of gpuboot.gpu_operator.upgrade_max_parallel nodes, 3600 at least].")
@click.option("--insecure-skip-host-key-check", is_flag=True, help="Turn SSH host-key checking off (logged).")
@click.option("--skip-mirror-check", is_flag=True, help="Do not check that the mirror holds the target release (logged).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def upgrade(app: App, inventory: str, to_release: str, show_plan: bool, canary: int, batch: str, resume: bool,
            drain_timeout: int, gate_timeout: int, gate_settle: int, driver_timeout: int | None, insecure_skip_host_key_check: bool,
            skip_mirror_check: bool, output: str) -> None:
    """Upgrade the cluster's Kubernetes to another release of the matrix: an etcd snapshot, the
    control planes one at a time, then the workers (canary, batches), each node gated; then,
    where the release moves them, the GPU drivers through the GPU Operator's upgrade controller."""
    cluster = load_cluster(inventory, check_files=not show_plan)
    plan = plan_upgrade(cluster, to_release, canary=canary, batch=batch, drain_timeout=drain_timeout,
                        gate_timeout=gate_timeout, resume=resume, driver_timeout=driver_timeout,
                        gate_settle=gate_settle)
    if show_plan:
        _print_plan(app, plan, output)
        return
    target = cluster.at_release(plan.to_release)
    phases = [p for p in UPGRADE if p.name in plan.phases]
    resume = f"gpuboot upgrade {inventory} --to {to_release} --resume"
    mirror_preflight(app, target, phases, skip_mirror_check)
    state = app.cluster_state(cluster)
    run_phases(app, target, phases, output, check=False, diff=False, force=True,
         host_key_checking=not insecure_skip_host_key_check, command="upgrade",
         extravars={"gpuboot_upgrade": plan.as_data() | {"resume_command": resume},
                    "gpuboot_etcd_snapshot_dir": str(state.root / "etcd-snapshots")},
         resume_hint=resume)
    message = (f"cluster {plan.cluster} runs {plan.to_version}. Now set gpuboot.release: {plan.to_release} in "
               f"{inventory}: until then `gpuboot up` refuses to run (it would move the packages back).")
    if output == "json":
        click.echo(json.dumps({"event": "UpgradeFinished", "version": plan.to_version, "release": plan.to_release,
                               "next": message}))
    else:
        app.console.print(f"[green]upgraded[/]: {message}")


def _print_plan(app: App, plan, output: str) -> None:
    steps = plan.steps()
    if output == "json":
        click.echo(json.dumps({"upgrade": plan.as_data(), "node_steps": plan.node_steps(),
                               "steps": [vars(s) for s in steps]}, indent=2))
        return
    out = app.console.out  # plain text: node names and labels are not markup
    out(f"upgrade of cluster {plan.cluster}: {plan.from_release} ({plan.from_version}) -> {plan.to_release} "
        f"({plan.to_version}), in this order:")
    width = max(len(s.node) for s in steps)
    for index, step in enumerate(steps, 1):
        out(f"{index:4}. {step.node:{width}}  {step.stage:13}  {step.action}")
    out("each node from the control planes on, one control plane at a time and the workers batch by batch:")
    for index, text in enumerate(plan.node_steps(), 1):
        out(f"      {index}. {text}")
    out("nothing was changed (--plan)")


@cli.group()
def etcd() -> None:
    """Snapshots of the cluster's etcd, and restoring one."""


@etcd.command("snapshot")
@inventory_arg
@click.option("--insecure-skip-host-key-check", is_flag=True, help="Turn SSH host-key checking off (logged).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def etcd_snapshot(app: App, inventory: str, insecure_skip_host_key_check: bool, output: str) -> None:
    """Take an etcd snapshot on the first control plane, check it with `etcdutl snapshot
    status` and copy it beside the cluster's state (etcd-snapshots/, 0600)."""
    cluster = load_cluster(inventory, check_files=True)
    folder = app.cluster_state(cluster).root / "etcd-snapshots"
    before = set(folder.glob("*.db"))
    run_phases(app, cluster, list(ETCD_SNAPSHOT), output, check=False, diff=False, force=True,
         host_key_checking=not insecure_skip_host_key_check, command="etcd snapshot",
         extravars={"gpuboot_etcd_snapshot_dir": str(folder)},
         resume_hint=f"gpuboot etcd snapshot {inventory}")
    made = sorted(set(folder.glob("*.db")) - before)
    if output == "json":
        click.echo(json.dumps({"event": "SnapshotSaved", "snapshots": [str(p) for p in made]}))
    else:
        for path in made:
            app.console.print(f"[green]snapshot[/] {path} ({path.stat().st_size} bytes; status in {path.with_suffix('.json').name})")


@etcd.command("restore")
@inventory_arg
@click.argument("snapshot", type=click.Path(dir_okay=False, exists=True))
@click.option("--yes-replace-the-cluster-state", "confirmed", is_flag=True,
              help="Confirm: every change to the cluster after the snapshot is lost.")
@click.option("--insecure-skip-host-key-check", is_flag=True, help="Turn SSH host-key checking off (logged).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def etcd_restore(app: App, inventory: str, snapshot: str, confirmed: bool, insecure_skip_host_key_check: bool,
                 output: str) -> None:
    """Restore every etcd member of the control plane from SNAPSHOT (a file `gpuboot etcd
    snapshot` or `gpuboot upgrade` saved). The API is down while it runs; each member's data
    before the restore is kept beside it (/var/lib/etcd.before-restore-<run>)."""
    path = Path(snapshot).resolve()
    if not confirmed:
        raise UsageError("a restore replaces the whole cluster's state with the snapshot's",
                         hint=f"gpuboot etcd restore {inventory} {snapshot} --yes-replace-the-cluster-state")
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise UsageError(f"{path} is readable by others ({oct(stat.S_IMODE(path.stat().st_mode))}): an etcd "
                         "snapshot holds every Secret of the cluster", hint=f"chmod 600 {path}")
    cluster = load_cluster(inventory, check_files=True)
    run_phases(app, cluster, list(ETCD_RESTORE), output, check=False, diff=False, force=True,
         host_key_checking=not insecure_skip_host_key_check, command="etcd restore",
         extravars={"gpuboot_etcd_restore": {"snapshot": str(path)}},
         resume_hint=f"gpuboot etcd restore {inventory} {snapshot} --yes-replace-the-cluster-state")
    if output != "json":
        app.console.print(f"[green]restored[/] cluster {cluster.settings.cluster_name} from {path}")


@cli.group()
def node() -> None:
    """Add inventory hosts to the running cluster, or take one out."""


@node.command("add")
@inventory_arg
@click.argument("hosts", nargs=-1, required=True)
@click.option("--insecure-skip-host-key-check", is_flag=True, help="Turn SSH host-key checking off (logged).")
@click.option("--skip-mirror-check", is_flag=True, help="Do not check that the mirror holds what the nodes pull (logged).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def node_add(app: App, inventory: str, hosts: tuple[str, ...], insecure_skip_host_key_check: bool,
             skip_mirror_check: bool, output: str) -> None:
    """Prepare and join HOSTS (already in the inventory): only they and the first control plane
    are touched (a new control plane: every control plane's HA endpoint too; the bridge CNI:
    every node's routes)."""
    from gpuboot import nodes
    cluster = load_cluster(inventory, check_files=True)
    change = nodes.add(cluster, hosts)
    mirror_preflight(app, cluster, change.phases, skip_mirror_check)
    run_phases(app, cluster, list(change.phases), output, check=False, diff=False, force=False,
         host_key_checking=not insecure_skip_host_key_check, command="node add", limit=change.limit,
         unlimited=change.unlimited, resume_hint=f"gpuboot node add {inventory} {' '.join(hosts)}")


@node.command("remove")
@inventory_arg
@click.argument("host")
@click.option("--yes-remove-it", "confirmed", is_flag=True, help="Confirm: the node is drained, reset and deleted.")
@click.option("--unreachable", is_flag=True, help="The node is gone: skip its kubeadm reset, remove it from the cluster only.")
@click.option("--drain-timeout", type=int, default=DEFAULT_DRAIN_TIMEOUT, show_default=True)
@click.option("--insecure-skip-host-key-check", is_flag=True, help="Turn SSH host-key checking off (logged).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def node_remove(app: App, inventory: str, host: str, confirmed: bool, unreachable: bool, drain_timeout: int,
                insecure_skip_host_key_check: bool, output: str) -> None:
    """Drain HOST, kubeadm reset it (a control plane leaves etcd), delete its Node object.
    Then take it out of the inventory and run `gpuboot up` (the HA endpoint forgets it)."""
    from gpuboot import nodes
    if not confirmed:
        raise UsageError(f"removing {host} drains it and resets Kubernetes on it",
                         hint=f"gpuboot node remove {inventory} {host} --yes-remove-it")
    cluster = load_cluster(inventory, check_files=True)
    via, data = nodes.remove(cluster, host, reachable=not unreachable)
    data["drain_timeout"] = drain_timeout
    run_phases(app, cluster, list(NODE_REMOVE), output, check=False, diff=False, force=True,
         host_key_checking=not insecure_skip_host_key_check, command="node remove",
         extravars={"gpuboot_node_remove": data}, limit=(via,) if unreachable else (via, host),
         resume_hint=f"gpuboot node remove {inventory} {host} --yes-remove-it")
    if output != "json":
        app.console.print(f"[green]removed[/] {host} from cluster {cluster.settings.cluster_name}; now take it out of "
                          f"{inventory} and run `gpuboot up {inventory}`")


@cli.command()
@inventory_arg
@click.option("--yes-destroy-the-cluster", "confirmed", is_flag=True,
              help="Confirm: Kubernetes is taken apart on every node; its data is gone.")
@click.option("--insecure-skip-host-key-check", is_flag=True, help="Turn SSH host-key checking off (logged).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def reset(app: App, inventory: str, confirmed: bool, insecure_skip_host_key_check: bool, output: str) -> None:
    """kubeadm reset on every node (workers, then control planes one at a time), the VIP
    stopped. Packages and node preparation stay; `gpuboot up` builds the cluster anew."""
    if not confirmed:
        raise UsageError("reset takes the whole cluster apart: every workload and all of etcd's data are lost",
                         hint=f"take a snapshot first (gpuboot etcd snapshot {inventory}); then "
                              f"gpuboot reset {inventory} --yes-destroy-the-cluster")
    cluster = load_cluster(inventory, check_files=True)
    state = app.cluster_state(cluster)
    run_phases(app, cluster, list(RESET), output, check=False, diff=False, force=True,
         host_key_checking=not insecure_skip_host_key_check, command="reset",
         resume_hint=f"gpuboot reset {inventory} --yes-destroy-the-cluster")
    # The admin credentials of a cluster that is gone.
    (state.root / "admin.conf").unlink(missing_ok=True)
    if output != "json":
        app.console.print(f"[green]reset[/] cluster {cluster.settings.cluster_name}; `gpuboot up {inventory}` builds it anew")
