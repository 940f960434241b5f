"""End to end, for real: upstream registry -> `mirror pull` -> bundle -> `mirror import`
into an empty TLS mirror with credentials -> the container_runtime phase configures a lab
node's containerd -> the node pulls nvcr.io/... and registry.k8s.io/... by their original
names through the mirror and runs one. The lab's firewall keeps every node off the
internet, and the registry's access log proves where each request went."""
from __future__ import annotations

import json
import re
from ipaddress import ip_network

import pytest

from gpuboot.cli.main import run
from gpuboot.lab.cluster import Lab, LabSpec
from gpuboot.mirror import pki
from gpuboot.mirror.serve import ServeSpec, start
from tests.integration.conftest import edit_inventory, ssh
from tests.support.mirror_fixture import free_port, start_upstream

pytestmark = pytest.mark.lab

SUBNET = "10.213.80.0/24"
DRIVER = "nvcr.io/nvidia/lab/driver:570.158.01-ubuntu22.04"
PAUSE = "registry.k8s.io/lab/pause:3.10.1"
CA_ON_NODE = "/etc/containerd/certs.d/gpuboot-mirror-ca.crt"


@pytest.fixture
def airgap_lab(lab, tmp_path):
    # `lab` first: the shared fixture decides skip-or-fail on machines without the lab.
    node_lab = Lab(tmp_path / "_lab", log=lambda m: None)
    node_lab.down("airgap")
    inventory = tmp_path / "lab" / "inventory.yml"
    state = node_lab.up(LabSpec(name="airgap", control_planes=1, workers=0, gpu_workers=0, subnet=SUBNET,
                                flavour="containerd"), inventory)
    try:
        yield {"lab": node_lab, "state": state, "inventory": inventory}
    finally:
        node_lab.down("airgap")


def test_nodes_pull_original_names_through_the_mirror_only(airgap_lab, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(tmp_path / "state"))
    upstream = start_upstream(tmp_path / "upstream")
    gateway = str(next(ip_network(SUBNET).hosts()))
    creds = tmp_path / "secrets" / "mirror.json"
    creds.parent.mkdir(mode=0o700)
    creds.write_text(json.dumps({"username": "nodes", "password": "Lab-mirror-pw-1"}))
    mirror = start(ServeSpec(tmp_path / "mirror", f"{gateway}:{free_port(gateway)}", credentials_file=creds))
    try:
        bundle = tmp_path / "bundle"
        assert run(["mirror", "--releases-dir", str(upstream.releases_dir), "pull", "--release", upstream.release,
                    "--out", str(bundle), *upstream.sources]) == 0
        upstream.registry.stop()  # from here on the connected side is gone
        assert run(["mirror", "import", str(bundle), "--registry", mirror.spec.listen,
                    "--ca-file", str(mirror.ca_file), "--credentials-file", str(creds)]) == 0

        def air_gapped(data):
            data["all"]["vars"]["gpuboot"]["mirror"] = {
                "air_gapped": True, "registry": mirror.spec.listen,
                "ca_file": str(mirror.ca_file), "credentials_file": str(creds)}
        inventory = edit_inventory(airgap_lab["inventory"], tmp_path / "inv" / "inventory.yml", air_gapped)
        assert run(["up", str(inventory), "--only", "container_runtime"]) == 0
        capsys.readouterr()

        info = {"lab": airgap_lab["lab"], "state": airgap_lab["state"]}
        node = next(iter(airgap_lab["state"].addresses))
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
    finally:
        mirror.stop()
        upstream.registry.stop()
