"""End to end, for real: upstream registry -> `mirror pull` -> bundle -> `mirror import`
into an empty TLS mirror with credentials -> the container_runtime phase configures a lab
node's containerd -> the node pulls nvcr.io/... and registry.k8s.io/... by their original
names through the mirror and runs one. The lab's firewall keeps every node off the
internet, and the registry's access log proves where each request went."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from ipaddress import ip_network
from pathlib import Path

import pytest

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.mirror import pki
from gpuboot.mirror.packages import export_public_key, write_index
from gpuboot.mirror.serve import ServeSpec, start
from gpuboot_lab import artifacts as lab_artifacts
from tests.integration.conftest import containerd_node, edit_inventory, ssh
from tests.support.mirror_fixture import free_port, signing_key, start_upstream

pytestmark = pytest.mark.lab

SUBNET = "10.213.80.0/24"
DRIVER = "nvcr.io/nvidia/lab/driver:570.158.01-ubuntu22.04"
PAUSE = "registry.k8s.io/lab/pause:3.10.1"
CA_ON_NODE = "/etc/containerd/certs.d/gpuboot-mirror-ca.crt"
STANDIN = Path(__file__).resolve().parents[2] / "tests" / "doubles" / "kube_packages" / "standin_repo.py"


@pytest.fixture
def airgap_lab(lab_required, tmp_path):
    with containerd_node(tmp_path, "airgap", SUBNET) as info:
        yield info


def _package_sources(directory: Path, release: str) -> Path:
    """What an operator downloads on the connected side for Debian 12: containerd.io at the
    matrix's version (the lab's build of it: containerd 2 and runc from Go modules, as Docker's
    repository is out of reach here), and TEST DOUBLE Kubernetes packages (stand-ins with the
    real names and the matrix's versions) until the lab packages the built binaries."""
    os_dir = directory / "debian-12"
    os_dir.mkdir(parents=True)
    pkgs = matrix.load(release).os["debian-12"]
    kube = pkgs.kube_packages
    subprocess.run([sys.executable, str(STANDIN), kube.version, str(os_dir), kube.model_extra["cri_tools"],
                    kube.model_extra["kubernetes_cni"]], check=True, capture_output=True)
    runtime = lab_artifacts.runtime_repository(release, log=lambda m: None)
    for deb in runtime.glob(f"{pkgs.containerd['package']}_*.deb"):
        shutil.copyfile(deb, os_dir / deb.name)
    (os_dir / "Packages").unlink()  # the double's own index; the mirror writes its own
    return directory


def test_nodes_pull_original_names_through_the_mirror_only(airgap_lab, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(tmp_path / "state"))
    release = "k8s-1.36"  # the lab inventory's
    upstream = start_upstream(tmp_path / "upstream", base=release)
    gateway = str(next(ip_network(SUBNET).hosts()))
    creds = tmp_path / "secrets" / "mirror.json"
    creds.parent.mkdir(mode=0o700)
    creds.touch(mode=0o600)
    creds.write_text(json.dumps({"username": "nodes", "password": "Lab-mirror-pw-1"}))
    packages_dir = tmp_path / "mirror-packages"
    mirror = start(ServeSpec(tmp_path / "mirror", f"{gateway}:{free_port(gateway)}", credentials_file=creds,
                             packages_dir=packages_dir, packages_listen=f"{gateway}:{free_port(gateway)}"))
    try:
        # Connected side: the images of the test release and the Debian 12 packages it plans.
        def plan_for_pull(data):
            data["all"]["vars"]["gpuboot"]["release"] = upstream.release
            data["all"]["vars"]["gpuboot"]["node_os"] = {"id": "debian-12"}
        pull_inventory = edit_inventory(airgap_lab["inventory"], tmp_path / "pull" / "inventory.yml", plan_for_pull)
        bundle = tmp_path / "bundle"
        assert run(["mirror", "--releases-dir", str(upstream.releases_dir), "pull", str(pull_inventory),
                    "--out", str(bundle), "--packages-from", str(_package_sources(tmp_path / "debs", release)),
                    *upstream.sources]) == 0
        upstream.registry.stop()  # from here on the connected side is gone

        # Air-gapped side: images into the registry, packages into a signed apt repository.
        key_id = signing_key(tmp_path / "gnupg")
        packages_dir.mkdir()
        assert run(["mirror", "import", str(bundle), "--registry", mirror.spec.listen,
                    "--ca-file", str(mirror.ca_file), "--credentials-file", str(creds),
                    "--packages-dir", str(packages_dir), "--gpg-home", str(tmp_path / "gnupg"),
                    "--gpg-key", key_id]) == 0
        assert (packages_dir / "debian-12" / "InRelease").is_file()
        public_key = tmp_path / "secrets" / "packages.asc"
        export_public_key(str(tmp_path / "gnupg"), key_id, public_key)

        mirror_settings = {"air_gapped": True, "registry": mirror.spec.listen,
                           "ca_file": str(mirror.ca_file), "credentials_file": str(creds),
                           "packages_url": f"https://{mirror.spec.packages_listen}",
                           "packages_key_file": str(public_key)}

        def air_gapped(data):
            data["all"]["vars"]["gpuboot"]["mirror"] = mirror_settings
            data["all"]["vars"]["gpuboot"]["node_os"] = {"id": "debian-12"}
        inventory = edit_inventory(airgap_lab["inventory"], tmp_path / "inv" / "inventory.yml", air_gapped)
        # The air-gap preflight checks the packages kube_packages will install, then the run goes on.
        assert run(["up", str(inventory), "--only", "container_runtime", "--only", "kube_packages"]) == 0
        assert "holds all 6 artifacts these phases need" in capsys.readouterr().err

        # verify of the connected side's inventory: every image and every package is in the mirror.
        pull_data = edit_inventory(pull_inventory, tmp_path / "verify" / "inventory.yml",
                                   lambda data: data["all"]["vars"]["gpuboot"].update(mirror=mirror_settings))
        assert run(["mirror", "--releases-dir", str(upstream.releases_dir), "verify", str(pull_data)]) == 0
        assert "and 6 packages" in capsys.readouterr().out

        info = {"lab": airgap_lab["lab"], "state": airgap_lab["state"]}
        node = next(iter(airgap_lab["state"].addresses))
        # The Kubernetes packages came from the mirror's signed repository over HTTPS.
        kube_version = matrix.load(release).os["debian-12"].kube_packages.version
        installed = ssh(info, node, "dpkg-query -W -f '${Version}' kubeadm")
        assert installed.stdout == kube_version, installed.stdout + installed.stderr
        served = (mirror.spec.root / "packages-access.log").read_text()
        assert '"GET /debian-12/./InRelease HTTP/1.1" 200' in served  # signed, and checked by apt
        assert f'"GET /debian-12/./kubeadm_{kube_version}_amd64.deb HTTP/1.1" 200' in served
        pull = "ctr -n k8s.io images pull --hosts-dir /etc/containerd/certs.d"
        result = ssh(info, node, f"set -e; {pull} {DRIVER} >/dev/null; {pull} {PAUSE} >/dev/null; "
                                 f"ctr -n k8s.io run --rm {DRIVER} probe /bin/busybox cat /etc/image-id")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "driver"  # the image's own layer, run on the node

        listed = ssh(info, node, "ctr -n k8s.io images ls -q").stdout.split()
        assert DRIVER in listed and PAUSE in listed  # stored under the upstream names

        # By the mirror's own name too (kubeadm's imageRepository in an air gap): CA and credentials apply.
        direct = ssh(info, node, f"{pull} {mirror.spec.listen}/{PAUSE} >/dev/null")
        assert direct.returncode == 0, direct.stderr

        miss = ssh(info, node, f"{pull} nvcr.io/nvidia/lab/absent:1")
        assert miss.returncode != 0 and "not found" in (miss.stderr + miss.stdout)

        log = mirror.log.read_text()
        # Every request came to the mirror, under the upstream's name as the path prefix.
        assert re.search(r'"(HEAD|GET) /v2/nvcr.io/nvidia/lab/driver/manifests/570.158.01-ubuntu22.04\?ns=nvcr.io', log)
        assert re.search(r'"(HEAD|GET) /v2/registry.k8s.io/lab/pause/manifests/3.10.1\?ns=registry.k8s.io', log)
        assert re.search(r'/v2/nvcr.io/nvidia/lab/absent/manifests/1\?ns=nvcr.io HTTP/1.1" 404', log)

        # Wrong CA: with another CA in the trusted file the node refuses the mirror.
        stranger, _key = pki.ensure_ca(tmp_path / "stranger-ca")
        untrusted = ssh(info, node, f"cp {CA_ON_NODE} /root/ca.bak; cat > {CA_ON_NODE} <<'PEM'\n"
                                    f"{stranger.read_text()}PEM\n"
                                    f"ctr -n k8s.io images rm {PAUSE} >/dev/null; {pull} {PAUSE}; rc=$?; "
                                    f"cp /root/ca.bak {CA_ON_NODE}; exit $rc")
        assert untrusted.returncode != 0 and "unknown authority" in (untrusted.stderr + untrusted.stdout)

        # A package that left the repository is named by the preflight before any node is touched.
        (packages_dir / "debian-12" / f"kubectl_{kube_version}_amd64.deb").unlink()
        write_index(packages_dir / "debian-12")
        assert run(["up", str(inventory), "--only", "kube_packages", "--force"]) == 6
        assert f"debian-12: kubectl={kube_version}: not in the mirror's repository" in capsys.readouterr().err
    finally:
        mirror.stop()
        upstream.registry.stop()
