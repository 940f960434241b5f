"""`gpuboot lab ...`: the local test hosts."""
from __future__ import annotations

import json
from pathlib import Path

import click

from gpuboot.cli.main import App, cli, pass_app


def _lab(app: App, name: str):
    from gpuboot.lab.cluster import Lab
    # Cluster names are DNS labels, so "_lab" can never collide with a cluster's state.
    return Lab(app.state_dir / "_lab" / name, log=lambda msg: app.console.print(f"[dim]{msg}[/]"))


@cli.group()
def lab() -> None:
    """Real local test hosts: systemd containers with sshd on a fenced network."""


@lab.command("up")
@click.option("--name", default="lab", show_default=True, help="Lab name (hosts are NAME-cp1, ...).")
@click.option("--control-planes", default=3, show_default=True, type=click.IntRange(1, 7))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(0, 200))
@click.option("--gpu-workers", default=1, show_default=True, type=click.IntRange(0, 200))
@click.option("--subnet", default="10.213.0.0/24", show_default=True)
@click.option("--flavour", type=click.Choice(["plain", "containerd", "kubernetes"]), default="plain", show_default=True,
              help="containerd: privileged nodes with their own /var/lib/containerd; kubernetes: kind-like nodes for kubelet.")
@click.option("--release", default="k8s-1.34", show_default=True)
@click.option("--inventory", "inventory", default="inventories/lab/inventory.yml", show_default=True,
              type=click.Path(dir_okay=False))
@pass_app
def lab_up(app: App, name, control_planes, workers, gpu_workers, subnet, flavour, release, inventory) -> None:
    """Create the lab and write its inventory."""
    from gpuboot.lab.cluster import LabSpec
    spec = LabSpec(name, control_planes, workers, gpu_workers, subnet, flavour, release)
    state = _lab(app, name).up(spec, Path(inventory).resolve())
    app.console.print(f"[green]lab {name} up[/]: {len(state.containers)} nodes; inventory {inventory}")


@lab.command("down")
@click.option("--name", default="lab", show_default=True)
@pass_app
def lab_down(app: App, name: str) -> None:
    """Remove everything the lab created, and nothing else."""
    removed = _lab(app, name).down(name)
    app.console.print(f"removed {len(removed)} things" + "".join(f"\n  {r}" for r in removed))


@lab.command("mirror")
@click.argument("bundle", type=click.Path(file_okay=False, exists=True))
@click.option("--name", default="lab", show_default=True)
@pass_app
def lab_mirror(app: App, bundle: str, name: str) -> None:
    """Serve an air-gap mirror for the lab, import BUNDLE, and make its inventory use it."""
    state = _lab(app, name).start_mirror(Path(bundle).resolve())
    app.console.print(f"[green]lab {name} mirror up[/] (pid {state.mirror_pid}); stopped by `gpuboot lab down`")


@lab.command("status")
@click.option("--name", default="lab", show_default=True)
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_app
def lab_status(app: App, name: str, output: str) -> None:
    """Show the lab's nodes."""
    rows = _lab(app, name).status()
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        app.console.print("no lab")
    for row in rows if output == "text" else []:
        app.console.print(f"  {row['host']:14} {row['address']:15} {row['state']}")


@lab.command("molecule")
@click.argument("roles", nargs=-1)
@click.option("--keep", is_flag=True, help="Keep the molecule network and apt cache afterwards.")
@pass_app
def lab_molecule(app: App, roles: tuple[str, ...], keep: bool) -> None:
    """Run `molecule test` for every role (or the ones named), one after another."""
    from gpuboot.errors import LabError
    from gpuboot.lab.molecule import run_scenarios
    results = run_scenarios(app.state_dir, roles, log=lambda m: app.console.print(m), keep=keep)
    for r in results:
        app.console.print(f"  {'[green]ok[/]' if r.ok else '[red]FAILED[/]'} {r.role:20} {r.seconds:6.1f}s  {r.log}")
    failed = [r.role for r in results if not r.ok]
    if failed:
        raise LabError(f"molecule failed for: {', '.join(failed)}", hint="read the logs listed above")


def _vm_lab(app: App, name: str):
    from gpuboot.lab.cluster import DEFAULT_CACHE
    from gpuboot.lab.vm import VmLab
    return VmLab(app.state_dir / "_lab" / f"vm-{name}", DEFAULT_CACHE, log=lambda m: app.console.print(f"[dim]{m}[/]"))


@lab.command("vm-up")
@click.option("--name", default="vm", show_default=True)
@click.option("--count", default=1, show_default=True, type=click.IntRange(1, 3))
@click.option("--inventory", default="inventories/lab/vm-inventory.yml", show_default=True,
              type=click.Path(dir_okay=False))
@pass_app
def lab_vm_up(app: App, name: str, count: int, inventory: str) -> None:
    """Start VMs with their own kernel (slow: software emulation) and write their inventory."""
    state = _vm_lab(app, name).up(name, count, Path(inventory).resolve())
    app.console.print(f"[green]{len(state.vms)} VM(s) up[/]; inventory {inventory}")


@lab.command("vm-down")
@click.option("--name", default="vm", show_default=True)
@pass_app
def lab_vm_down(app: App, name: str) -> None:
    """Stop the VMs and remove their disks and inventory."""
    removed = _vm_lab(app, name).down()
    app.console.print(f"removed {len(removed)} VM(s)")


@lab.group("kubernetes")
def lab_kubernetes() -> None:
    """Real Kubernetes binaries built from Go modules (cached by version and recipe)."""


def _kube_build(app: App):
    from gpuboot.lab.kubernetes import KubernetesBuild
    return KubernetesBuild(log=lambda msg: app.console.print(msg))


@lab_kubernetes.command("build")
@click.option("--version", "version", default=None, help="A Kubernetes version of the matrix; default: the newest.")
@pass_app
def lab_kubernetes_build(app: App, version: str | None) -> None:
    """Build kubeadm, kubelet, kubectl and the control-plane binaries (resumable)."""
    result = _kube_build(app).build(version)
    app.console.print(f"[green]Kubernetes {result.version}[/]: {result.bin_dir}")


@lab_kubernetes.command("path")
@click.option("--version", "version", default=None, help="A Kubernetes version of the matrix; default: the newest.")
@pass_app
def lab_kubernetes_path(app: App, version: str | None) -> None:
    """Print the directory of the built binaries."""
    click.echo(str(_kube_build(app).path(version)))


@lab_kubernetes.command("bundle")
@click.option("--version", "version", default=None, help="A Kubernetes version of the matrix; default: the newest.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Bundle directory.")
@pass_app
def lab_kubernetes_bundle(app: App, version: str | None, out: str) -> None:
    """The built Kubernetes as images and .debs in a bundle, for `gpuboot mirror import`."""
    from gpuboot.lab.artifacts import write
    result = write(version, Path(out), log=lambda msg: app.console.print(f"[dim]{msg}[/]"))
    app.console.print(f"[green]bundle {out}[/]: {len(result.images)} images, {len(result.packages)} packages")
    for item in result.not_built:
        app.console.print(f"[yellow]not built[/]: {item}")
