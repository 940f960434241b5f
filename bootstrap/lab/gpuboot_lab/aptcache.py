"""The apt cache on the lab's gateway: the only way lab nodes reach Debian packages."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from gpuboot_lab.errors import LabError
from gpuboot_lab.image import debian_sources
from gpuboot_lab.process import stop_own_process

# Not apt-cacher-ng's usual 3142, so a system-wide cache on this machine cannot collide.
PORT = 3143


def _backend(uri: str) -> tuple[str, str]:
    """('deb.example/debian', 'http://deb.example/debian/') for a sources URI."""
    bare = uri.split("://", 1)[-1].rstrip("/")
    return bare, uri.rstrip("/") + "/"


def write_config(conf_dir: Path, bind: str) -> Path:
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "cache").mkdir(exist_ok=True)
    (conf_dir / "log").mkdir(exist_ok=True)
    lines = debian_sources()
    main = lines[0].split()[1]
    security = next((line.split()[1] for line in lines if "-security" in line), None)
    match, backend = _backend(main)
    # Pin the backends to the mirrors this host uses: acng's own default does not resolve here.
    text = [
        f"CacheDir: {conf_dir / 'cache'}",
        f"LogDir: {conf_dir / 'log'}",
        f"SocketPath: {conf_dir / 'acng.sock'}",
        f"PidFile: {conf_dir / 'acng.pid'}",
        f"Port: {PORT}",
        f"BindAddress: {bind}",
        "ForeGround: 1",
        "ExThreshold: 30",
        f"Remap-debrep: {match} /debian ; {backend}",
    ]
    if security:
        smatch, sbackend = _backend(security)
        text.append(f"Remap-secdeb: {smatch} /debian-security ; {sbackend}")
    (conf_dir / "acng.conf").write_text("\n".join(text) + "\n")
    return conf_dir


def start(conf_dir: Path, bind: str) -> int:
    if shutil.which("apt-cacher-ng") is None:
        raise LabError("apt-cacher-ng is not installed", hint="apt-get install apt-cacher-ng")
    with socket.socket() as probe:
        # A bind test, not a connect: connects can be answered by a transparent proxy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers
        try:
            probe.bind((bind, PORT))
        except OSError as exc:
            raise LabError(f"cannot listen on {bind}:{PORT}: {exc.strerror}",
                           hint="stop whatever listens there, or run `gpuboot lab down` for an old lab") from None
    write_config(conf_dir, bind)
    log = open(conf_dir / "log" / "stdout.log", "ab")
    proc = subprocess.Popen(["apt-cacher-ng", "-c", str(conf_dir)], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabError(f"apt-cacher-ng exited at start; see {conf_dir / 'log'}")
        if f"{bind}:{PORT}" in subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout:
            return proc.pid
        time.sleep(0.1)
    raise LabError(f"apt-cacher-ng did not listen on {bind}:{PORT} within 10 s")


def stop(pid: int | None) -> None:
    """Stop the cache by PID, and only if that PID is still apt-cacher-ng."""
    stop_own_process(pid, b"apt-cacher-ng")
