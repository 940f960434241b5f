"""`gpuboot render` of a large fleet shares the hosts among processes (one per core): the
files are the same as one process renders, and each keeps the mode its role lists."""
from __future__ import annotations

import stat
from pathlib import Path

from gpuboot.config.loader import load_cluster
from gpuboot.phases import render as render_module

SAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "sample" / "inventory.yml"


def tree(out: Path, files: list[Path]) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(out)): (p.read_text(), stat.S_IMODE(p.stat().st_mode)) for p in files}


def test_shared_among_processes_equals_one_process(tmp_path, monkeypatch):
    cluster = load_cluster(SAMPLE)
    serial = tree(tmp_path / "one", render_module.render(cluster, tmp_path / "one", ()))
    monkeypatch.setattr(render_module, "UNITS_PER_WORKER", 1)
    monkeypatch.setattr(render_module.os, "cpu_count", lambda: 3)
    assert render_module.render_workers(12) == 3
    shared = tree(tmp_path / "three", render_module.render(cluster, tmp_path / "three", ()))
    assert shared == serial
    # Modes are the role's: kubeadm's config and credential-bearing hosts.toml stay private.
    assert serial["cp01/etc/kubernetes/gpuboot/kubeadm-config.yaml"][1] == 0o600
    assert serial["gpu01/etc/containerd/certs.d/nvcr.io/hosts.toml"][1] == 0o600
    assert serial["cp01/etc/keepalived/keepalived.conf"][1] == 0o640
    assert serial["cp01/etc/sysctl.d/90-gpuboot.conf"][1] == 0o644


def test_a_site_renders_in_this_process():
    assert render_module.render_workers(11) == 1
