"""Real kubeadm (built from Go modules, `gpuboot lab kubernetes build`) on the configuration
gpuboot renders for the first control plane: `kubeadm config validate`, then the init
phases certs, kubeconfig, control-plane and etcd local into a scratch root (`--rootfs`),
and checks of what kubeadm really produced."""
from __future__ import annotations

import os
import shutil
import subprocess
from ipaddress import ip_address
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.mirror.plan import build
from gpuboot_lab.kubernetes import KubernetesBuild

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "inventories" / "sample" / "inventory.yml"
CONFIG = "etc/kubernetes/gpuboot/kubeadm-config.yaml"


def kubeadm_for(release_name: str) -> Path:
    if shutil.which("go") is None:
        if os.environ.get("GPUBOOT_REQUIRE_LAB") == "1":
            pytest.fail("go is missing: the Kubernetes build is required here")
        pytest.skip("go is missing")
    version = matrix.load(release_name).kubernetes.version
    return KubernetesBuild(log=lambda m: None).build(version).bin_dir / "kubeadm"


def kubeadm(binary: Path, *args: str) -> str:
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True)
    assert proc.returncode == 0, f"kubeadm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(params=["sample", "lab"])
def rendered(request, tmp_path, capsys):
    inventory = SAMPLE if request.param == "sample" else request.getfixturevalue("lab")["inventory"]
    out = tmp_path / "render"
    assert run(["--state-dir", str(tmp_path / "state"), "render", str(inventory), "--out", str(out),
                "--phase", "control_plane_init"]) == 0
    capsys.readouterr()
    cluster = load_cluster(inventory)
    first = cluster.control_planes[0]
    config = out / first.name / CONFIG
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    return cluster, config


def test_real_kubeadm_accepts_the_config_and_builds_a_control_plane_from_it(rendered, tmp_path):
    cluster, config = rendered
    binary = kubeadm_for(cluster.settings.release)
    assert "ok" in kubeadm(binary, "config", "validate", "--config", str(config))
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(config, root / "kubeadm.yaml")
    for phase in (["certs", "all"], ["kubeconfig", "all"], ["control-plane", "all"], ["etcd", "local"]):
        kubeadm(binary, "init", "phase", *phase, "--config", "/kubeadm.yaml", "--rootfs", str(root))

    # The API server's certificate holds the VIP, its DNS name and every control plane.
    cert = x509.load_pem_x509_certificate((root / "etc/kubernetes/pki/apiserver.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    addresses = {str(a) for a in san.get_values_for_type(x509.IPAddress)}
    names = set(san.get_values_for_type(x509.DNSName))
    endpoint = cluster.settings.control_plane
    assert str(endpoint.vip) in addresses
    if endpoint.dns_name:
        assert endpoint.dns_name in names
    for node in cluster.control_planes:
        assert node.address in addresses if _is_ip(node.address) else node.address in names
        assert node.name in names

    # kubeconfigs talk to the VIP (or its name), never to one node.
    admin = yaml.safe_load((root / "etc/kubernetes/admin.conf").read_text())
    server = admin["clusters"][0]["cluster"]["server"]
    assert server == f"https://{endpoint.dns_name or endpoint.vip}:{endpoint.port}"
    assert oct((root / "etc/kubernetes/admin.conf").stat().st_mode & 0o777) == "0o600"

    # Static pods use exactly the planned Kubernetes images, from the mirror when air-gapped.
    manifests = root / "etc/kubernetes/manifests"
    images = {yaml.safe_load(p.read_text())["spec"]["containers"][0]["image"] for p in manifests.glob("*.yaml")}
    assert len(images) == 4
    plan = build(matrix.load(cluster.settings.release))
    planned = {str(i.ref) for i in plan.images if i.component == "kubernetes"}
    mirror = cluster.settings.mirror
    prefix = f"{mirror.registry}/" if mirror.air_gapped else ""
    assert images <= {prefix + ref for ref in planned}
    if mirror.air_gapped:
        assert all(image.startswith(f"{mirror.registry}/registry.k8s.io/") for image in images)


def _is_ip(text: str) -> bool:
    try:
        ip_address(text)
        return True
    except ValueError:
        return False
