"""The Kubernetes built from Go modules enters the lab's mirror as a real user's would:
`gpuboot lab kubernetes bundle` writes images (named as `kubeadm config images list`
prints them) and .debs, `gpuboot mirror import` pushes them, and an air-gapped lab node
installs the real kubeadm, kubelet and kubectl packages from the mirror's signed
repository and pulls and runs the real kube-apiserver image by its upstream name."""
from __future__ import annotations

import json
from ipaddress import ip_network

import pytest

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.mirror.packages import export_public_key
from gpuboot.mirror.serve import ServeSpec, start
from tests.integration.conftest import containerd_node, edit_inventory, ssh
from tests.support.mirror_fixture import free_port, signing_key

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SUBNET = "10.213.81.0/24"
RELEASE = "k8s-1.34"  # the lab inventory's


@pytest.fixture
def node_lab(lab, tmp_path):
    # `lab` first: the shared fixture decides skip-or-fail on machines without the lab.
    with containerd_node(tmp_path, "kubemirror", SUBNET) as info:
        yield info


def test_built_kubernetes_is_installed_and_pulled_from_the_mirror(node_lab, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(tmp_path / "state"))
    version = matrix.load(RELEASE).kubernetes.version
    bundle = tmp_path / "bundle"
    assert run(["lab", "kubernetes", "bundle", "--version", version, "--out", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "not built" in out and "cri-tools" in out and "coredns" not in out.split("not built", 1)[1]

    gateway = str(next(ip_network(SUBNET).hosts()))
    creds = tmp_path / "secrets" / "mirror.json"
    creds.parent.mkdir(mode=0o700)
    creds.write_text(json.dumps({"username": "nodes", "password": "Lab-kube-mirror-pw"}))
    packages_dir = tmp_path / "packages"
    packages_dir.mkdir()
    mirror = start(ServeSpec(tmp_path / "mirror", f"{gateway}:{free_port(gateway)}", credentials_file=creds,
                             packages_dir=packages_dir, packages_listen=f"{gateway}:{free_port(gateway)}"))
    try:
        gnupg = tmp_path / "gnupg"
        key_id = signing_key(gnupg)
        assert run(["mirror", "import", str(bundle), "--registry", mirror.spec.listen, "--ca-file",
                    str(mirror.ca_file), "--credentials-file", str(creds), "--packages-dir", str(packages_dir),
                    "--gpg-home", str(gnupg), "--gpg-key", key_id]) == 0
        key = tmp_path / "secrets" / "packages.asc"
        export_public_key(str(gnupg), key_id, key)

        def air_gapped(data):
            data["all"]["vars"]["gpuboot"]["mirror"] = {
                "air_gapped": True, "registry": mirror.spec.listen, "ca_file": str(mirror.ca_file),
                "credentials_file": str(creds), "packages_url": f"https://{mirror.spec.packages_listen}",
                "packages_key_file": str(key)}
        inventory = edit_inventory(node_lab["inventory"], tmp_path / "inv" / "inventory.yml", air_gapped)
        assert run(["up", str(inventory), "--only", "container_runtime", "--only", "kube_packages"]) == 0
        capsys.readouterr()

        info = {"lab": node_lab["lab"], "state": node_lab["state"]}
        node = next(iter(node_lab["state"].addresses))
        versions = ssh(info, node, "kubeadm version -o short; kubelet --version; kubectl version --client | head -1; "
                                   "ls /opt/cni/bin | tr '\\n' ' '; echo; systemctl is-enabled kubelet")
        lines = versions.stdout.splitlines()
        assert lines[:3] == [version, f"Kubernetes {version}", f"Client Version: {version}"], versions.stdout
        assert "bridge" in lines[3] and "host-local" in lines[3] and "loopback" in lines[3]
        assert lines[4] == "enabled"

        pull = "ctr -n k8s.io images pull --hosts-dir /etc/containerd/certs.d"
        api = ssh(info, node, f"set -e; {pull} registry.k8s.io/kube-apiserver:{version} >/dev/null; "
                              f"ctr -n k8s.io run --rm registry.k8s.io/kube-apiserver:{version} api "
                              "kube-apiserver --version")
        assert api.returncode == 0 and api.stdout.strip() == f"Kubernetes {version}", api.stderr
        # The node's kubeadm and the mirror agree: every image it lists pulls through the mirror.
        listed = ssh(info, node, f"kubeadm config images list --kubernetes-version {version}").stdout.split()
        assert len(listed) == 7
        for ref in listed:
            got = ssh(info, node, f"{pull} {ref} >/dev/null")
            assert got.returncode == 0, (ref, got.stderr)
        coredns = next(ref for ref in listed if "coredns" in ref)
        ran = ssh(info, node, f"ctr -n k8s.io run --rm {coredns} dns /coredns -version")
        assert ran.stdout.startswith("CoreDNS-"), ran.stdout + ran.stderr
    finally:
        mirror.stop()
