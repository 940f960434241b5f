"""`gpuboot lab ...`: the local test hosts. The lab is not part of the product: gpuboot
finds this command group through the `gpuboot.commands` entry point (pyproject.toml)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from gpuboot.cli.core import App, pass_app
from gpuboot_lab import LAB_RELEASE

LAB_INVENTORY = "inventories/lab/inventory.yml"
VERSION_HELP = ("A Kubernetes version of the matrix; default: the one the lab inventory's release uses "
                "(--inventory), else the newest.")



def _lab(app: App, name: str):
    from gpuboot_lab.cluster import Lab
    # Cluster names are DNS labels, so "_lab" can never collide with a cluster's state.
    return Lab(app.state_dir / "_lab" / name, log=lambda msg: app.console.print(f"[dim]{msg}[/]"))


@click.group("lab")
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
@click.option("--release", default=LAB_RELEASE, show_default=True)
@click.option("--inventory", "inventory", default=LAB_INVENTORY, show_default=True, type=click.Path(dir_okay=False))
@pass_app
def lab_up(app: App, name, control_planes, workers, gpu_workers, subnet, flavour, release, inventory) -> None:
    """Create the lab and write its inventory."""
    from gpuboot_lab.cluster import LabSpec
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
@click.option("--parallel", default=2, show_default=True, type=click.IntRange(1, 8),
              help="Scenarios at once (ha_endpoint's always runs alone, after the others).")
@pass_app
def lab_molecule(app: App, roles: tuple[str, ...], keep: bool, parallel: int) -> None:
    """Run `molecule test` for every role (or the ones named), a few at a time."""
    from gpuboot_lab.errors import LabError
    from gpuboot_lab.molecule import run_scenarios
    results = run_scenarios(app.state_dir, roles, log=lambda m: app.console.print(m), keep=keep, parallel=parallel)
    for r in results:
        app.console.print(f"  {'[green]ok[/]' if r.ok else '[red]FAILED[/]'} {r.role:20} {r.seconds:6.1f}s  {r.log}")
    failed = [r.role for r in results if not r.ok]
    if failed:
        raise LabError(f"molecule failed for: {', '.join(failed)}", hint="read the logs listed above")


def _vm_lab(app: App, name: str):
    from gpuboot_lab.cluster import DEFAULT_CACHE
    from gpuboot_lab.vm import VmLab
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


@lab.group("helm")
def lab_helm() -> None:
    """A real helm for the control machine, built from its Go module (cached)."""


@lab_helm.command("build")
@pass_app
def lab_helm_build(app: App) -> None:
    """Build helm (once; later calls find it)."""
    from gpuboot_lab.helm import HelmBuild
    app.console.print(f"[green]helm[/]: {HelmBuild(log=lambda msg: app.console.print(msg)).build()}")


@lab_helm.command("path")
@pass_app
def lab_helm_path(app: App) -> None:
    """Print the built helm's path."""
    from gpuboot_lab.helm import HelmBuild
    click.echo(str(HelmBuild().path()))


@lab.group("kubernetes")
def lab_kubernetes() -> None:
    """Real Kubernetes binaries built from Go modules (cached by version and recipe)."""


def _version(version: str | None, inventory: str) -> str | None:
    """The Kubernetes version to build or find: as given, else the lab inventory's."""
    if version is not None or not Path(inventory).is_file():
        return version
    from gpuboot import matrix
    from gpuboot.config.loader import load_cluster
    return matrix.load(load_cluster(inventory).settings.release).kubernetes.version


def _kube_build(app: App):
    from gpuboot_lab.kubernetes import KubernetesBuild
    return KubernetesBuild(log=lambda msg: app.console.print(msg))


@lab_kubernetes.command("build")
@click.option("--version", "version", default=None, help=VERSION_HELP)
@click.option("--inventory", "inventory", default=LAB_INVENTORY, show_default=True, type=click.Path(dir_okay=False))
@pass_app
def lab_kubernetes_build(app: App, version: str | None, inventory: str) -> None:
    """Build kubeadm, kubelet, kubectl and the control-plane binaries (resumable)."""
    result = _kube_build(app).build(_version(version, inventory))
    app.console.print(f"[green]Kubernetes {result.version}[/]: {result.bin_dir}")


@lab_kubernetes.command("path")
@click.option("--version", "version", default=None, help=VERSION_HELP)
@click.option("--inventory", "inventory", default=LAB_INVENTORY, show_default=True, type=click.Path(dir_okay=False))
@pass_app
def lab_kubernetes_path(app: App, version: str | None, inventory: str) -> None:
    """Print the directory of the built binaries."""
    click.echo(str(_kube_build(app).path(_version(version, inventory))))


@lab_kubernetes.command("bundle")
@click.option("--version", "version", default=None, help=VERSION_HELP)
@click.option("--inventory", "inventory", default=LAB_INVENTORY, show_default=True, type=click.Path(dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Bundle directory.")
@pass_app
def lab_kubernetes_bundle(app: App, version: str | None, inventory: str, out: str) -> None:
    """The built Kubernetes as images and .debs in a bundle, for `gpuboot mirror import`."""
    from gpuboot_lab.artifacts import write
    result = write(_version(version, inventory), Path(out), log=lambda msg: app.console.print(f"[dim]{msg}[/]"))
    app.console.print(f"[green]bundle {out}[/]: {len(result.images)} images, {len(result.packages)} packages")
    for item in result.not_built:
        app.console.print(f"[yellow]not built[/]: {item}")


@lab.group("operators")
def lab_operators() -> None:
    """NVIDIA's operators built from their sources at the release's versions, as images under
    the names their charts give them (the source trees are inputs on this machine)."""


@lab_operators.command("bundle")
@click.option("--release", "release", default=LAB_RELEASE, show_default=True)
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Bundle directory.")
@click.option("--kube-vip", "kube_vip", is_flag=True, help="kube-vip's image instead (control_plane.mode kube_vip).")
@pass_app
def lab_operators_bundle(app: App, release: str, out: str, kube_vip: bool) -> None:
    """Build the operators' images into a bundle, for `gpuboot mirror push` or `gpuboot lab mirror`."""
    from gpuboot import matrix
    from gpuboot.mirror.bundle import Bundle
    from gpuboot_lab.operators import KUBE_VIP, OPERATORS, OperatorBuild, images
    chosen = matrix.load(release)
    bundle = Bundle(Path(out))
    built = images(bundle, chosen, OperatorBuild(log=lambda msg: app.console.print(f"[dim]{msg}[/]")),
                   (KUBE_VIP,) if kube_vip else OPERATORS)
    bundle.write_manifest(f"{chosen.name}-operators", built)
    app.console.print(f"[green]bundle {out}[/]: {', '.join(a.ref for a in built)}")


@lab.group("gpu-kit")
def lab_gpu_kit() -> None:
    """What tests/gpu/run.sh carries to a GPU machine: containerd 2, runc, crictl, the NVIDIA
    container toolkit, gpu-feature-discovery, a probe image and the node's rendered files."""


@lab_gpu_kit.command("build")
@pass_app
def lab_gpu_kit_build(app: App) -> None:
    """Build every binary and the probe image (cached by version)."""
    from gpuboot_lab.gpu_kit import GpuKit
    for name, path in GpuKit(log=lambda msg: app.console.print(f"[dim]{msg}[/]")).build().items():
        app.console.print(f"{name}: {path}")


@lab_gpu_kit.command("pack")
@click.option("--inventory", default="tests/gpu/inventory/hosts.ini", show_default=True,
              type=click.Path(dir_okay=False, exists=True))
@click.option("--host", default="gpu1", show_default=True, help="The inventory's host that stands for the GPU machine.")
@click.option("--out", default="tests/gpu/kit", show_default=True, type=click.Path(file_okay=False))
@pass_app
def lab_gpu_kit_pack(app: App, inventory: str, host: str, out: str) -> None:
    """One archive for the GPU machine (carry its folder to the run)."""
    from gpuboot_lab.gpu_kit import GpuKit, node_files
    files = node_files(Path(inventory), host)
    archive = GpuKit(log=lambda msg: app.console.print(f"[dim]{msg}[/]")).pack(Path(out), files)
    app.console.print(f"[green]{archive}[/]: {archive.stat().st_size / 2**20:.1f} MiB, {len(files)} node files")
