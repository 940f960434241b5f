"""A kubernetes-flavour lab for the add-on tests: the lab-built Kubernetes of a release turned
into a mirror bundle, helm built from its Go module, the nodes up and the inventory told to use
that helm. The caller adds its doubles to the bundle and starts the mirror."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot_lab.cluster import Lab, LabSpec, LabState
from gpuboot_lab.helm import HelmBuild
from tests.integration.conftest import built_kubectl


@dataclass
class AddonLab:
    lab: Lab
    state: LabState
    inventory: Path
    kubectl: Path
    helm: Path
    bundle: Path
    kubeconfig: Path

    def settings(self) -> dict:
        return yaml.safe_load(self.inventory.read_text())

    def write(self, data: dict) -> None:
        self.inventory.write_text(yaml.safe_dump(data, sort_keys=False))

    def info(self, **extra) -> dict:
        """What the tests read: the lab, its state, inventory, kubectl and kubeconfig, and `extra`."""
        return {"lab": self.lab, "state": self.state, "inventory": self.inventory, "kubectl": self.kubectl,
                "kubeconfig": self.kubeconfig, **extra}

    def start_mirror(self) -> str:
        """The mirror with the bundle; returns its registry (HOST:PORT)."""
        self.state = self.lab.start_mirror(self.bundle)
        return self.settings()["all"]["vars"]["gpuboot"]["mirror"]["registry"]


@contextmanager
def addon_lab(tmp_path: Path, monkeypatch, capsys, spec: LabSpec) -> Iterator[AddonLab]:
    version = matrix.load(spec.release).kubernetes.version
    kubectl = built_kubectl(version)
    helm = HelmBuild(log=lambda m: None).build()
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(tmp_path / "state"))
    bundle = tmp_path / "bundle"
    assert run(["lab", "kubernetes", "bundle", "--version", version, "--out", str(bundle)]) == 0
    capsys.readouterr()
    node_lab = Lab(tmp_path / "state" / "_lab" / spec.name, log=lambda msg: None)
    node_lab.down(spec.name)
    inventory = tmp_path / "lab" / "inventory.yml"
    try:
        state = node_lab.up(spec, inventory)
        lab = AddonLab(node_lab, state, inventory, kubectl, helm, bundle, tmp_path / "state" / spec.name / "admin.conf")
        data = lab.settings()
        data["all"]["vars"]["gpuboot"]["tools"] = {"helm": str(helm)}
        lab.write(data)
        yield lab
    finally:
        node_lab.down(spec.name)


def kubectl(info: dict, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run([str(info["kubectl"]), "--kubeconfig", str(info["kubeconfig"]), "--request-timeout=10s", *args],
                          input=stdin, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def said(capsys) -> str:
    captured = capsys.readouterr()
    return (captured.out + captured.err)[-6000:]


def phase_changes(info: dict) -> dict[str, int]:
    """Each phase's changed-task count in the cluster's state record, as the last run left it."""
    record = json.loads((info["kubeconfig"].parent / "state.json").read_text())["phases"]
    return {name: entry["changed"] for name, entry in record.items()}
