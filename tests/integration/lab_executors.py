"""Executor containers for the split run (docs/executors.md) beside a lab: the lab's node image
with sshd, on the lab's network, reached with the lab's key and known by their host keys, with
this venv and its Python mounted read-only at the same paths, as an execution node would have
them installed. Used by the split-run lab test and the benchmark (tests/bench/up_scale.py); a
lab's `down` removes them with its nodes (they carry its label)."""
from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from ipaddress import ip_network
from pathlib import Path

import yaml

from gpuboot_lab.cluster import Lab, container_name

FIRST_HOST = 200  # executors take the lab subnet's hosts from .200 up, clear of the nodes


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
    addresses = list(ip_network(state.spec.subnet).hosts())
    mounts = [*python_mounts(), lab.dir]
    runner = Path(sys.prefix) / "bin" / "ansible-runner"
    executors, keys = [], []
    for index in range(count):
        name, address = f"ex{index + 1}", str(addresses[FIRST_HOST + index])
        keys.append(lab.run_extra(name, address, mounts))
        executors.append({"name": name, "address": address, "runner": str(runner)})
    known = workdir / "executors_known_hosts"
    known.write_text("".join(keys))
    data = yaml.safe_load(inventory.read_text())
    data["all"]["vars"]["gpuboot"]["executors"] = [{**e, "known_hosts_file": str(known)} for e in executors]
    split = workdir / f"{inventory.stem}-{count}-executors.yml"
    split.write_text(yaml.safe_dump(data, sort_keys=False))
    containers = [container_name(state.spec.name, e["name"]) for e in executors]
    return Executors(split, containers, {e["name"]: e["address"] for e in executors})
