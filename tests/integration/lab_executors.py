"""Executor containers for the split run (docs/executors.md) beside a lab: the lab's node image
with sshd, on the lab's network, reached with the lab's key and known by their host keys, with
this venv and its Python mounted read-only at the same paths, as an execution node would have
them installed. Used by the split-run lab test and the benchmark (tests/bench/up_scale.py); a
lab's `down` removes them with its nodes (they carry its label)."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from ipaddress import ip_network
from pathlib import Path

import yaml

from gpuboot_lab.cluster import LABEL, Lab
from gpuboot_lab.image import ensure_image

FIRST_HOST = 200  # executors take the lab subnet's hosts from .200 up, clear of the nodes
SSH_WAIT_SECONDS = 120


@dataclass
class Executors:
    inventory: Path        # a copy of the lab's inventory naming them in gpuboot.executors
    containers: list[str]  # podman names, in gpuboot.executors' order
    addresses: dict[str, str]  # name -> address on the lab's network


def python_mounts() -> list[Path]:
    """What runs this venv's Python on another Debian: the venv, and the interpreter's own
    prefix where it has one of its own (pyenv, /opt); a distribution's Python under /usr is
    mounted piecewise (its binary, standard library and libpython) to leave the image's /usr."""
    venv, base = Path(sys.prefix), Path(sys.base_prefix)
    # A venv reached through a symlink: its scripts' shebangs name the real path.
    venvs = list(dict.fromkeys([venv, Path(os.path.realpath(venv))]))
    if base not in (Path("/usr"), Path("/")):
        return [base, *venvs]
    paths = {Path(os.path.realpath(sys.executable)), Path(sysconfig.get_paths()["stdlib"])}
    library = sysconfig.get_config_var("LDLIBRARY") or ""
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and library:
        paths.add(Path(os.path.realpath(Path(sysconfig.get_config_var("LIBDIR")) / library)))
    return sorted(paths) + venvs


def start(lab: Lab, count: int, inventory: Path, workdir: Path) -> Executors:
    """`count` executors ex1..exN beside `lab`, and a copy of `inventory` that names them."""
    state = lab.load()
    if state is None:
        raise RuntimeError(f"no lab under {lab.dir}")
    image = ensure_image(lab.podman, lab.cache_dir, log=lambda message: None)
    addresses = list(ip_network(state.spec.subnet).hosts())
    add_hosts = [arg for name, ip in state.addresses.items() for arg in ("--add-host", f"{name}:{ip}")]
    mounts = [arg for path in python_mounts() for arg in ("-v", f"{path}:{path}:ro")]
    runner = Path(sys.prefix) / "bin" / "ansible-runner"
    executors, containers = [], []
    for index in range(count):
        name, address = f"ex{index + 1}", str(addresses[FIRST_HOST + index])
        container = f"gpuboot-{state.spec.name}-{name}"
        lab.podman.run("rm", "-f", container, check=False)
        lab.podman.run("run", "-d", "--name", container, "--hostname", f"{state.spec.name}-{name}",
                       "--label", f"{LABEL}={state.spec.name}", "--network", state.network, "--ip", address,
                       "--dns=none", *add_hosts, "--systemd=always", "--cap-add", "SYS_ADMIN,NET_ADMIN,NET_RAW",
                       "-v", f"{lab.dir / 'authorized_keys'}:/root/.ssh/authorized_keys:ro", *mounts,
                       "-v", f"{lab.dir}:{lab.dir}:ro", image)
        containers.append(container)
        executors.append({"name": name, "address": address, "runner": str(runner)})
    known = workdir / "executors_known_hosts"
    known.write_text("".join(host_key(e["name"], e["address"]) for e in executors))
    data = yaml.safe_load(inventory.read_text())
    data["all"]["vars"]["gpuboot"]["executors"] = [{**e, "known_hosts_file": str(known)} for e in executors]
    split = workdir / f"{inventory.stem}-{count}-executors.yml"
    split.write_text(yaml.safe_dump(data, sort_keys=False))
    return Executors(split, containers, {e["name"]: e["address"] for e in executors})


def host_key(name: str, address: str) -> str:
    """The executor's ed25519 host key as known_hosts lines, once its sshd answers."""
    deadline = time.monotonic() + SSH_WAIT_SECONDS
    while True:
        scan = subprocess.run(["ssh-keyscan", "-T", "3", "-t", "ed25519", address], capture_output=True, text=True)
        lines = [line for line in scan.stdout.splitlines() if line and not line.startswith("#")]
        if lines:
            return "\n".join(lines) + "\n"
        if time.monotonic() > deadline:
            raise RuntimeError(f"executor {name} ({address}) has no ssh after {SSH_WAIT_SECONDS} s")
        time.sleep(1)
