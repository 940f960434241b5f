"""`gpuboot mirror ...`: plan, pull, import, verify and serve the air-gap mirror."""
from __future__ import annotations

import json
import os
from pathlib import Path

import click

from gpuboot.cli.core import App, cli, pass_app
from gpuboot.errors import UsageError


class MirrorContext:
    def __init__(self, releases_dir: str | None) -> None:
        self.releases_dir = Path(releases_dir) if releases_dir else None

    def plan(self, inventory: str | None, release: str | None):
        """The plan for an inventory (its release, OS, kernels, GPUs, NICs) or a bare release."""
        from gpuboot import matrix
        from gpuboot.config.loader import load_cluster
        from gpuboot.mirror.plan import Target, build
        if bool(inventory) == bool(release):
            raise UsageError("give either an INVENTORY or --release, not both and not neither")
        if inventory:
            cluster = load_cluster(inventory, releases_dir=self.releases_dir)
            release = matrix.load(cluster.settings.release, self.releases_dir)
            return build(release, Target.of(cluster, release)), cluster
        return build(matrix.load(release, self.releases_dir)), None


pass_mirror = click.make_pass_decorator(MirrorContext)
plan_source = [click.argument("inventory", required=False, type=click.Path(dir_okay=False)),
               click.option("--release", help="Plan a release without an inventory (no per-node images).")]


def _with(options):
    def apply(func):
        for option in reversed(options):
            func = option(func)
        return func
    return apply


def _registry(address: str, ca_file: str | None, credentials_file: str | None, plain_http: bool):
    from gpuboot.mirror.registry import Registry, read_credentials
    url = address if "://" in address else f"{'http' if plain_http else 'https'}://{address}"
    return Registry(url, ca_file=ca_file, credentials=read_credentials(credentials_file))


def _size(value: int) -> str:
    return f"{value / 1e9:.2f} GB" if value >= 1e9 else f"{value / 1e6:.1f} MB"


@cli.group()
@click.option("--releases-dir", envvar="GPUBOOT_RELEASES_DIR", type=click.Path(file_okay=False),
              help="Read release files from here instead of the shipped mirror/releases.")
@click.pass_context
def mirror(ctx: click.Context, releases_dir: str | None) -> None:
    """The air-gap mirror: artifact plan, bundle, registry."""
    ctx.obj = MirrorContext(releases_dir)


@mirror.command("plan")
@_with(plan_source)
@click.option("--bundle", type=click.Path(file_okay=False), help="Take artifact sizes from this bundle.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@pass_mirror
def mirror_plan(ctx: MirrorContext, inventory, release, bundle, output) -> None:
    """List every image, chart and package the cluster needs, with a count and a size."""
    plan, _cluster = ctx.plan(inventory, release)
    sizes: dict[str, int] = {}
    if bundle:
        from gpuboot.mirror.bundle import Bundle
        _name, artifacts = Bundle(Path(bundle)).read_manifest()
        sizes = {a.ref: a.size for a in artifacts}
    rows = ([{"kind": "image", "ref": str(i.ref), "component": i.component, "why": i.why,
              "pinned": bool(i.ref.digest), "size": sizes.get(str(i.ref))} for i in plan.images]
            + [{"kind": "chart", "ref": str(c), "component": c.component, "why": "chart",
                "pinned": bool(c.digest), "size": sizes.get(str(c))} for c in plan.charts]
            + [{"kind": "package", "ref": str(p), "component": p.os, "why": p.why, "pinned": bool(p.version),
                "size": None} for p in plan.packages])
    known = [r["size"] for r in rows if r["size"] is not None]
    summary = {"release": plan.release, "images": len(plan.images), "charts": len(plan.charts),
               "packages": len(plan.packages), "total": len(rows), "unpinned": plan.unpinned,
               "size_known_for": len(known), "size": sum(known), "notes": plan.notes}
    if output == "json":
        click.echo(json.dumps({"summary": summary, "artifacts": rows}, indent=2))
        return
    for row in rows:
        size = f"  {_size(row['size'])}" if row["size"] is not None else ""
        click.echo(f"{row['kind']:8} {row['ref']}{size}  [{row['component']}; {row['why']}]")
    for note in plan.notes:
        click.echo(f"note: {note}")
    click.echo(f"{len(rows)} artifacts: {len(plan.images)} images, {len(plan.charts)} charts, "
               f"{len(plan.packages)} packages; size {_size(summary['size'])} for {len(known)} "
               f"({'from the bundle' if bundle else 'pass --bundle for sizes'}); "
               f"{len(plan.unpinned)} unpinned (tag only, no digest in the release)")


@mirror.command("pull")
@_with(plan_source)
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Bundle directory.")
@click.option("--source", "sources", multiple=True, metavar="HOST=URL",
              help="Reach upstream HOST at URL instead (repeatable), e.g. nvcr.io=https://proxy:5000/nvcr.io.")
@click.option("--source-ca-file", type=click.Path(dir_okay=False, exists=True))
@click.option("--sign-key", type=click.Path(dir_okay=False, exists=True), help="SSH key that signs bundle.json.")
@click.option("--packages-from", type=click.Path(file_okay=False, exists=True),
              help="OS packages to carry: DIR/<os id>/*.deb (every planned one must be there).")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(1, 32))
@pass_mirror
def mirror_pull(ctx: MirrorContext, inventory, release, out, sources, source_ca_file, sign_key, packages_from,
                workers) -> None:
    """Connected side: fetch the whole plan into a bundle. Re-run to resume."""
    from gpuboot.mirror.bundle import Bundle
    from gpuboot.mirror.pull import Puller, Sources
    plan, _cluster = ctx.plan(inventory, release)
    overrides = {}
    for item in sources:
        host, sep, url = item.partition("=")
        if not sep or not host or not url:
            raise UsageError(f"--source {item!r} is not HOST=URL")
        overrides[host] = url
    puller = Puller(Bundle(Path(out)), Sources(overrides, ca_file=source_ca_file), workers=workers,
                    progress=click.echo)
    result = puller.run(plan, sign_key, Path(packages_from) if packages_from else None)
    click.echo(f"bundle {out}: {result.artifacts} artifacts; {result.blobs_fetched} blobs fetched "
               f"({_size(result.bytes_fetched)}), {result.blobs_present} already there; {result.seconds:.1f}s")


@mirror.command("import")
@click.argument("bundle", type=click.Path(file_okay=False, exists=True))
@click.option("--registry", required=True, metavar="HOST:PORT")
@click.option("--ca-file", type=click.Path(dir_okay=False, exists=True), help="CA of the registry's certificate.")
@click.option("--credentials-file", type=click.Path(dir_okay=False, exists=True))
@click.option("--allowed-signers", type=click.Path(dir_okay=False, exists=True),
              help="ssh-keygen allowed-signers file: refuse a bundle not signed by one of them.")
@click.option("--plain-http", is_flag=True, help="The registry speaks HTTP (labs only).")
@click.option("--packages-dir", type=click.Path(file_okay=False),
              help="Write the bundle's OS packages here as apt repositories, one per OS (served at mirror.packages_url).")
@click.option("--gpg-home", type=click.Path(file_okay=False, exists=True), help="GnuPG home holding the signing key.")
@click.option("--gpg-key", help="Key that signs the package repositories (nodes trust it via mirror.packages_key_file).")
@click.option("--workers", type=click.IntRange(1, 32), default=None, help="Parallel uploads (default: cores).")
@pass_app
def mirror_import(app: App, bundle, registry, ca_file, credentials_file, allowed_signers, plain_http, packages_dir,
                  gpg_home, gpg_key, workers) -> None:
    """Air-gapped side: push a bundle into the registry, verifying every digest."""
    from gpuboot.mirror.bundle import Bundle
    from gpuboot.mirror.push import Importer
    target = _registry(registry, ca_file, credentials_file, plain_http)
    result = Importer(Bundle(Path(bundle)), target, workers=workers, progress=click.echo,
                      packages_dir=Path(packages_dir) if packages_dir else None, gpg_home=gpg_home,
                      gpg_key=gpg_key).run(allowed_signers)
    click.echo(f"imported into {registry}: {result.artifacts} artifacts ({result.already_present} already there); "
               f"{result.blobs_uploaded} blobs uploaded ({_size(result.bytes_uploaded)}, {result.mb_per_s:.0f} MB/s), "
               f"{result.blobs_mounted} mounted, {result.blobs_present} present; {result.seconds:.2f}s")


@mirror.command("verify")
@_with(plan_source)
@click.option("--registry", metavar="HOST:PORT", help="Default: the inventory's mirror.registry.")
@click.option("--ca-file", type=click.Path(dir_okay=False, exists=True))
@click.option("--credentials-file", type=click.Path(dir_okay=False, exists=True))
@click.option("--plain-http", is_flag=True)
@pass_mirror
def mirror_verify(ctx: MirrorContext, inventory, release, registry, ca_file, credentials_file, plain_http) -> None:
    """Check that the registry holds every artifact of the plan; name what is missing."""
    from gpuboot.mirror.verify import require_complete
    plan, cluster = ctx.plan(inventory, release)
    packages_url = None
    if cluster is not None:
        mirror_settings = cluster.settings.mirror
        registry = registry or mirror_settings.registry
        ca_file = ca_file or mirror_settings.ca_file
        credentials_file = credentials_file or mirror_settings.credentials_file
        packages_url = mirror_settings.packages_url
    if not registry:
        raise UsageError("no registry: pass --registry or set gpuboot.mirror.registry in the inventory")
    require_complete(plan, _registry(registry, ca_file, credentials_file, plain_http),
                     packages_url if plan.packages else None, ca_file)
    packages = f" and {len(plan.packages)} packages" if packages_url and plan.packages else ""
    click.echo(f"mirror {registry} holds all {len(plan.images) + len(plan.charts)} images and charts{packages} "
               f"of release {plan.release}")


@mirror.command("cert")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="Where ca.crt/ca.key are (created when missing) and server.crt/server.key are written.")
@click.option("--name", "names", multiple=True, required=True,
              help="A DNS name or address nodes use to reach the mirror (repeatable; the first is the subject).")
def mirror_cert(directory, names) -> None:
    """Issue the mirror's server certificate from gpuboot's CA (made on first use)."""
    from gpuboot.mirror import pki
    ca_cert, ca_key = pki.ensure_ca(Path(directory))
    cert, key = pki.issue_server_cert(ca_cert, ca_key, list(names), Path(directory))
    click.echo(f"CA {ca_cert} (gpuboot.mirror.ca_file); certificate {cert} and key {key} "
               "(gpuboot.mirror.tls_cert_file, tls_key_file)")


@mirror.command("serve")
@click.option("--root", required=True, type=click.Path(file_okay=False), help="Config, storage and TLS live here.")
@click.option("--listen", default="0.0.0.0:5000", show_default=True, metavar="HOST:PORT")
@click.option("--name", "names", multiple=True, help="Extra certificate name or address (repeatable).")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), help="Your certificate (default: gpuboot's CA issues one).")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True))
@click.option("--credentials-file", type=click.Path(dir_okay=False, exists=True),
              help="JSON username/password: the one user allowed to push and pull.")
@click.option("--packages-dir", type=click.Path(file_okay=False, exists=True),
              help="Also serve these package repositories (from `mirror import --packages-dir`).")
@click.option("--packages-listen", default="0.0.0.0:8443", show_default=True, metavar="HOST:PORT")
@click.option("--plain-http", is_flag=True, help="No TLS (labs only).")
def mirror_serve(root, listen, names, tls_cert, tls_key, credentials_file, packages_dir, packages_listen,
                 plain_http) -> None:
    """Run the mirror registry in the foreground (the registry_mirror role runs it as a service)."""
    import signal
    import sys
    import time

    from gpuboot.mirror.serve import ServeSpec, command, start, write_config
    if bool(tls_cert) != bool(tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    spec = ServeSpec(Path(root).resolve(), listen, tls=not plain_http, names=tuple(names),
                     tls_cert=Path(tls_cert) if tls_cert else None, tls_key=Path(tls_key) if tls_key else None,
                     credentials_file=Path(credentials_file) if credentials_file else None,
                     packages_dir=Path(packages_dir) if packages_dir else None,
                     packages_listen=packages_listen if packages_dir else None)
    if not spec.packages_dir:
        config = write_config(spec)
        _announce(spec, tls_cert)
        argv = command(config)
        os.execv(argv[0], argv)
    # `kill PID` (or `gpuboot lab down`) and a closed terminal must stop the registry too: it
    # runs in its own session, so turn SIGTERM and SIGHUP into an exit that runs the cleanup
    # below; set before the registry starts, so no signal finds the default action. (A
    # SIGKILL, or a signal while it starts, reaches it through the kernel: serve._end_with_parent.)
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda signum, frame: sys.exit(0))
    running = start(spec)
    _announce(spec, tls_cert)
    click.echo(f"packages: {'https' if spec.tls else 'http'}://{packages_listen}/<os id>/ from {packages_dir}")
    try:
        while running.process.poll() is None:
            time.sleep(1)
    finally:
        running.stop()


def _announce(spec, tls_cert) -> None:
    if spec.tls and not tls_cert:
        click.echo(f"CA for nodes and clients: {spec.root / 'pki' / 'ca.crt'}")
    click.echo(f"serving {spec.url} from {spec.root / 'data'}")
