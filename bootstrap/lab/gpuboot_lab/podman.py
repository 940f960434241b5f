"""The one place that runs podman for the lab, with the settings this sandbox needs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from gpuboot_lab.errors import LabError

# Without raised ulimits every `podman run` fails here with "setrlimit RLIMIT_NOFILE";
# crun cannot handle the host's hybrid cgroups, runc can.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
"""


def write_containers_conf(cache_dir: Path) -> Path:
    path = cache_dir / "containers.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != CONTAINERS_CONF:
        path.write_text(CONTAINERS_CONF)
    return path


class Podman:
    def __init__(self, cache_dir: Path) -> None:
        if shutil.which("podman") is None:
            raise LabError(
                "podman is not installed",
                hint="apt-get install podman runc mmdebstrap apt-cacher-ng uidmap nftables",
            )
        self.env = dict(os.environ, CONTAINERS_CONF=str(write_containers_conf(cache_dir)))

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise LabError(f"podman {' '.join(args[:3])} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def exists(self, kind: str, name: str) -> bool:
        """kind is one of image, container, network, volume."""
        if kind == "network":
            return self.run("network", "exists", name, check=False).returncode == 0
        return self.run(kind, "exists", name, check=False).returncode == 0

    def network_gateways(self, name: str) -> list[str]:
        out = self.run("network", "inspect", name, "--format", "{{range .Subnets}}{{.Gateway}} {{end}}",
                       check=False).stdout
        return out.split()

    def containers(self, label: str) -> list[dict]:
        out = self.run("ps", "-a", "--filter", f"label={label}", "--format", "json").stdout
        return json.loads(out or "[]")

    def names(self, kind: str, label: str) -> list[str]:
        if kind == "container":
            return [c["Names"][0] for c in self.containers(label)]
        fmt = "{{.Name}}"
        out = self.run(kind, "ls", "--filter", f"label={label}", "--format", fmt).stdout
        return [line for line in out.splitlines() if line.strip()]
