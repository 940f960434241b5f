"""`gpuboot render` writes what the phases would write, touching no host (the sample's
hosts do not exist), and matches the reviewed golden copy in tests/golden/sample."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpuboot.cli.main import run
from tests.support.golden import matches_golden

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "inventories" / "sample" / "inventory.yml"
GOLDEN = ROOT / "tests" / "golden" / "sample"


def test_render_sample_matches_golden(tmp_path, capsys):
    out = tmp_path / "render"
    assert run(["render", str(SAMPLE), "--out", str(out)]) == 0
    got = matches_golden(out, GOLDEN)
    # GPU workers get the nouveau blacklist, others do not.
    assert "gpu01/etc/modprobe.d/gpuboot-blacklist-nouveau.conf" in got
    assert "cp01/etc/modprobe.d/gpuboot-blacklist-nouveau.conf" not in got
    # Secrets are references: the credential files' paths, never their content.
    assert "credentials_file: /etc/gpuboot/secrets/mirror-credentials.json" in got["cluster/settings.yml"]
    nvcr = got["gpu01/etc/containerd/certs.d/nvcr.io/hosts.toml"]
    assert "<secret: Basic credentials read from /etc/gpuboot/secrets/mirror-credentials.json>" in nvcr
    # Air-gapped: the mirror is the server, so a miss never falls back to the internet.
    assert 'server = "https://mirror01.example.internal:5000/v2/nvcr.io"' in nvcr and "override_path = true" in nvcr
    assert 'imports = ["/etc/containerd/conf.d/*.toml"]' in got["cp01/etc/containerd/config.toml"]
    # kubeadm's configuration exists for the first control plane only, images from the mirror.
    kubeadm = [name for name in got if name.endswith("kubeadm-config.yaml")]
    assert kubeadm == ["cp01/etc/kubernetes/gpuboot/kubeadm-config.yaml"]
    assert 'imageRepository: "mirror01.example.internal:5000/registry.k8s.io"' in got[kubeadm[0]]
    # The mirror's own name has a hosts.toml too (CA and credentials for imageRepository pulls).
    assert "gpu01/etc/containerd/certs.d/mirror01.example.internal:5000/hosts.toml" in got


def test_render_unknown_or_unrenderable_phase(tmp_path, capsys):
    assert run(["render", str(SAMPLE), "--phase", "nope", "--out", str(tmp_path)]) == 2
    assert "no such phase" in capsys.readouterr().err
    assert run(["render", str(SAMPLE), "--phase", "validate", "--out", str(tmp_path)]) == 2
    assert "nothing to render yet" in capsys.readouterr().err


def test_external_endpoint_port_is_the_models_in_the_rendered_kubeadm_config(tmp_path):
    """Regression: the model said 6443 for mode external while a second copy of the defaults
    made kubeadm's controlPlaneEndpoint :8443. Now Ansible only ever sees the model's value."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n"
        "  vars:\n"
        "    gpuboot: {cluster_name: ext, release: k8s-1.36,\n"
        "              control_plane: {vip: 10.0.0.100, mode: external}, networking: {cni: bridge}}\n"
        "  children:\n"
        "    control_plane: {hosts: {cp1: {ansible_host: 10.0.0.11}}}\n")
    out = tmp_path / "out"
    assert run(["render", str(inventory), "--phase", "control_plane_init", "--out", str(out)]) == 0
    config = (out / "cp1/etc/kubernetes/gpuboot/kubeadm-config.yaml").read_text()
    assert 'controlPlaneEndpoint: "10.0.0.100:6443"' in config


def test_render_beside_gpuboot_s_ansible_cfg_writes_nothing_there(tmp_path):
    """Rendering runs Ansible's templating in this process and gathers no facts: the jsonfile
    fact cache that gpuboot's ansible.cfg names must not appear in the working directory
    (a checkout the tests run from, or an operator's folder holding a copy of the file)."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "ansible.cfg", work / "ansible.cfg")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    done = subprocess.run([sys.executable, "-m", "gpuboot", "render", str(SAMPLE), "--phase", "os_prep",
                           "--out", str(tmp_path / "render")], cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert any((tmp_path / "render").rglob("*.conf")), "the render wrote nothing: the check below would be empty"
    assert sorted(p.name for p in work.iterdir()) == ["ansible.cfg"]
