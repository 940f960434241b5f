"""`gpuboot lab mirror BUNDLE`: an air-gap mirror for a running lab, as production has one.

`gpuboot mirror serve` runs detached on the lab network's gateway (TLS from gpuboot's CA,
one user, a signed apt repository), the bundle enters it as `gpuboot mirror import` brings one in,
and the lab inventory is rewritten air-gapped to use it. `gpuboot lab down` stops it."""
from __future__ import annotations

import hashlib
import json
import secrets
import socket
import subprocess
import sys
import time
from ipaddress import ip_network
from pathlib import Path

import yaml

from gpuboot.mirror.bundle import Bundle
from gpuboot.mirror.packages import export_public_key, new_signing_key
from gpuboot.mirror.push import Importer
from gpuboot.mirror.registry import Registry, read_credentials
from gpuboot.net import free_port
from gpuboot_lab.errors import LabError
from gpuboot_lab.process import runs, stop_own_process

KEY_EMAIL = "lab-mirror@gpuboot.invalid"


def _wait_listening(host: str, port: int, proc: subprocess.Popen, log: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabError(f"the lab mirror exited at start; see {log}")
        with socket.socket() as probe:
            probe.settimeout(0.3)
            if probe.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise LabError(f"the lab mirror did not listen on {host}:{port} within {timeout:.0f} s; see {log}")


def _short_home(home: Path) -> Path:
    """gpg-agent's sockets live in the home and a socket path may be 107 bytes at most: lab
    directories can be deeper than that, so gpg gets a short link to the real home."""
    link = Path("/tmp") / f"gpuboot-gpg-{hashlib.sha256(str(home).encode()).hexdigest()[:12]}"
    if not link.is_symlink():
        link.symlink_to(home)
    return link


def _signing_key(home: Path) -> str:
    if not (home / "pubring.kbx").exists():
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        new_signing_key(str(_short_home(home)), f"gpuboot lab mirror <{KEY_EMAIL}>")
    return KEY_EMAIL


def _done_with_gpg(home: Path) -> None:
    short = _short_home(home)
    subprocess.run(["gpgconf", "--homedir", str(short), "--kill", "gpg-agent"], capture_output=True)
    short.unlink()


def start(lab_dir: Path, subnet: str, bundle: Path, inventory: Path, log=print) -> int:
    """Serve, import, point the inventory at it; return the server's PID (its process group)."""
    root = lab_dir / "mirror"
    secrets_dir = root / "secrets"
    secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    creds = secrets_dir / "mirror.json"
    if not creds.exists():
        creds.touch(mode=0o600)
        creds.write_text(json.dumps({"username": "lab", "password": secrets.token_urlsafe(24)}))
    packages = root / "packages"
    packages.mkdir(exist_ok=True)
    gateway = str(next(ip_network(subnet).hosts()))
    registry, packages_listen = f"{gateway}:{free_port(gateway)}", f"{gateway}:{free_port(gateway)}"
    out = root / "serve.log"
    with out.open("ab") as handle:
        proc = subprocess.Popen([sys.executable, "-m", "gpuboot", "mirror", "serve", "--root", str(root / "registry"),
                                 "--listen", registry, "--credentials-file", str(creds), "--packages-dir",
                                 str(packages), "--packages-listen", packages_listen],
                                stdout=handle, stderr=handle, stdin=subprocess.DEVNULL, start_new_session=True)
    ca = root / "registry" / "pki" / "ca.crt"
    try:
        for listen in (registry, packages_listen):
            host, port = listen.rsplit(":", 1)
            _wait_listening(host, int(port), proc, out)
        _import(root, registry, bundle, log)
    except BaseException:
        stop(proc.pid)  # not recorded yet: `lab down` could not find it
        raise
    text = inventory.read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    data = yaml.safe_load(text)
    data["all"]["vars"]["gpuboot"]["mirror"] = {
        "air_gapped": True, "registry": registry, "ca_file": str(ca), "credentials_file": str(creds),
        "packages_url": f"https://{packages_listen}", "packages_key_file": str(secrets_dir / "packages.asc")}
    inventory.write_text(header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    log(f"lab mirror on {registry} (packages on {packages_listen}); {inventory} now air-gapped through it")
    return proc.pid


def _import(root: Path, registry: str, bundle: Path, log) -> None:
    """What `gpuboot mirror import` does, through the library: every digest verified, the
    packages added to the signed repository (its index covers every package it holds)."""
    secrets_dir = root / "secrets"
    key = _signing_key(root / "gnupg")
    gpg_home = str(_short_home(root / "gnupg"))
    try:
        target = Registry(f"https://{registry}", ca_file=str(root / "registry" / "pki" / "ca.crt"),
                          credentials=read_credentials(str(secrets_dir / "mirror.json")))
        result = Importer(Bundle(bundle), target, progress=log, packages_dir=root / "packages", gpg_home=gpg_home,
                          gpg_key=key).run(None)
        log(f"imported {result.artifacts} artifacts into {registry} ({result.already_present} already there)")
        export_public_key(gpg_home, key, secrets_dir / "packages.asc")
    finally:
        _done_with_gpg(root / "gnupg")


def import_into(lab_dir: Path, inventory: Path, bundle: Path, log=print) -> None:
    """Another bundle into the running lab mirror (a second release before an upgrade)."""
    registry = yaml.safe_load(inventory.read_text())["all"]["vars"]["gpuboot"]["mirror"]["registry"]
    _import(lab_dir / "mirror", registry, bundle, log)


PROGRAM = b"mirror\x00serve"


def running(pid: int | None) -> bool:
    return runs(pid, PROGRAM)


def stop(pid: int | None) -> bool:
    """Stop the mirror's process group, only if that PID is still our `mirror serve`."""
    return stop_own_process(pid, PROGRAM, group=True)
