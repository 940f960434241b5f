"""Run the mirror registry: the CNCF distribution registry (`docker-registry` on Debian),
storage on disk, TLS from gpuboot's CA or the operator's, optional htpasswd users."""
from __future__ import annotations

import ctypes
import functools
import http.server
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import jinja2
import yaml

from gpuboot import content
from gpuboot.errors import MirrorError
from gpuboot.files import write_private
from gpuboot.mirror import pki
from gpuboot.mirror.registry import read_credentials

BINARY = "docker-registry"


@dataclass(frozen=True)
class ServeSpec:
    root: Path                      # config, storage, pki and logs live here
    listen: str                     # HOST:PORT
    tls: bool = True
    names: tuple[str, ...] = ()     # extra certificate names (DNS names, addresses)
    tls_cert: Path | None = None    # the operator's own certificate and key
    tls_key: Path | None = None
    credentials_file: Path | None = None  # JSON {"username", "password"}: one htpasswd user
    packages_dir: Path | None = None      # apt repositories written by `mirror import --packages-dir`
    packages_listen: str | None = None    # HOST:PORT they are served on (same TLS)

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.listen}"

    @property
    def tls_files(self) -> tuple[Path, Path]:
        """The certificate and key served: the operator's, or the one gpuboot's CA issues."""
        if self.tls_cert and self.tls_key:
            return self.tls_cert, self.tls_key
        return self.root / "pki" / "server.crt", self.root / "pki" / "server.key"


def write_config(spec: ServeSpec) -> Path:
    """Render the registry_mirror role's own template, so `mirror serve` and the role run
    the registry with one configuration."""
    spec.root.mkdir(parents=True, exist_ok=True)
    if spec.tls and not spec.tls_cert:
        ca_cert, ca_key = pki.ensure_ca(spec.root / "pki")
        pki.issue_server_cert(ca_cert, ca_key, [spec.host, *spec.names], spec.root / "pki")
    cert, key = spec.tls_files
    htpasswd = ""
    if spec.credentials_file:
        user, password = read_credentials(str(spec.credentials_file))  # type: ignore[misc]
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
        htpasswd = str(spec.root / "htpasswd")
        write_private(Path(htpasswd), f"{user}:{hashed}\n")
    templates = content.content_dir() / "roles" / "registry_mirror" / "templates"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True)
    text = env.get_template("config.yml.j2").render(
        registry_mirror_served_storage=str(spec.root / "data"), registry_mirror_served_listen=spec.listen,
        registry_mirror_served_remote="",
        registry_mirror_http_secret=_http_secret(spec.root), registry_mirror_tls=spec.tls,
        registry_mirror_tls_cert_dest=str(cert), registry_mirror_tls_key_dest=str(key),
        registry_mirror_htpasswd_dest=htpasswd)
    yaml.safe_load(text)  # a template change that breaks YAML fails here, not in the registry
    path = spec.root / "config.yml"
    write_private(path, text)
    return path


def _http_secret(root: Path) -> str:
    path = root / "http-secret"
    if not path.is_file():
        write_private(path, secrets.token_hex(32))
    return path.read_text().strip()


def command(config: Path) -> list[str]:
    binary = shutil.which(BINARY)
    if binary is None:
        raise MirrorError(f"{BINARY} is not installed", hint="apt-get install docker-registry")
    return [binary, "serve", str(config)]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the stdlib's name)
        with open(self.server.access_log, "a") as out:  # type: ignore[attr-defined]
            out.write(f"{self.address_string()} {format % args}\n")


def serve_packages(spec: ServeSpec) -> http.server.ThreadingHTTPServer:
    """A read-only HTTPS file server for the package repositories, in a background thread."""
    assert spec.packages_dir and spec.packages_listen
    host, port = spec.packages_listen.rsplit(":", 1)
    handler = functools.partial(_QuietHandler, directory=str(spec.packages_dir))
    server = http.server.ThreadingHTTPServer((host, int(port)), handler)
    server.access_log = spec.root / "packages-access.log"  # type: ignore[attr-defined]
    if spec.tls:
        cert, key = spec.tls_files
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(cert), str(key))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True, name="gpuboot-packages").start()
    return server


class RunningRegistry:
    """A registry process started in the background (the lab and tests); stop() ends it."""

    def __init__(self, spec: ServeSpec, process: subprocess.Popen, log: Path,
                 packages: http.server.ThreadingHTTPServer | None = None) -> None:
        self.spec, self.process, self.log, self.packages = spec, process, log, packages

    @property
    def ca_file(self) -> Path | None:
        return self.spec.root / "pki" / "ca.crt" if self.spec.tls and not self.spec.tls_cert else None

    def stop(self) -> None:
        if self.packages is not None:
            self.packages.shutdown()
            self.packages.server_close()
            self.packages = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_PR_SET_PDEATHSIG = 1


def _end_with_parent() -> None:
    """In the registry's child before exec: the kernel sends it SIGTERM when the process that
    started it dies, even by SIGKILL, so no registry outlives gpuboot (Linux prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def start(spec: ServeSpec, timeout: float = 10) -> RunningRegistry:
    config = write_config(spec)
    log = spec.root / "registry.log"
    with open(log, "ab") as out:
        # Its own session keeps a terminal's Ctrl-C for gpuboot, which then stops it in order.
        process = subprocess.Popen(command(config), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=_end_with_parent)
    host, port = spec.listen.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise MirrorError(f"registry exited at start ({process.returncode}); see {log}")
        try:
            with socket.create_connection((host, int(port)), timeout=0.5):
                pass
        except OSError:
            time.sleep(0.05)
            continue
        return RunningRegistry(spec, process, log, _packages_or_stop(spec, process))
    process.kill()
    raise MirrorError(f"registry did not listen on {spec.listen} within {timeout:.0f}s; see {log}")


def _packages_or_stop(spec: ServeSpec, registry: subprocess.Popen) -> http.server.ThreadingHTTPServer | None:
    """The package server beside a registry that already answers; the registry stops with it when
    its address is taken, so a failed start leaves nothing serving."""
    if not spec.packages_dir:
        return None
    try:
        return serve_packages(spec)
    except OSError as err:
        registry.kill()
        registry.wait()
        raise MirrorError(f"the package server could not listen on {spec.packages_listen}: {err.strerror or err}",
                          hint="another process holds that address (ss -ltnp shows which); "
                               "stop it or give --packages-listen another port") from err
