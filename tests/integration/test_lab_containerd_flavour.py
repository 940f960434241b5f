"""The lab's containerd flavour: a privileged node with its own /var/lib/containerd volume,
where Debian's containerd runs a real container from a locally built image (nothing pulled)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuboot_lab.cluster import Lab, LabSpec
from tests.integration.conftest import ssh

pytestmark = pytest.mark.lab

BUILDER = (Path(__file__).resolve().parents[2] / "tests" / "support" / "oci_image.py").read_text()


def test_containerd_flavour_runs_a_container_and_down_removes_its_volume(lab_required, tmp_path):
    flavoured = Lab(tmp_path / "_lab", log=lambda m: None)
    flavoured.down("ctdtest")
    state = flavoured.up(LabSpec(name="ctdtest", control_planes=1, workers=0, gpu_workers=0,
                                 subnet="10.213.79.0/24", flavour="containerd"), tmp_path / "inventory.yml")
    try:
        info = {"lab": flavoured, "state": state}
        node = next(iter(state.addresses))
        result = ssh(info, node, "set -e; apt-get install -y -qq containerd busybox-static >/dev/null; "
                                 "systemctl start containerd; findmnt -no FSTYPE /var/lib/containerd; "
                                 f"cat > /root/oci_image.py <<'PY'\n{BUILDER}\nPY\n"
                                 "python3 /root/oci_image.py /bin/busybox /root/img.tar nvcr.io/lab/busybox:1; "
                                 "ctr -n k8s.io images import /root/img.tar >/dev/null; "
                                 "ctr -n k8s.io run --rm nvcr.io/lab/busybox:1 probe /bin/busybox echo ran-in-lab-node")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.split()
        assert lines[0] != "overlay"  # its own volume, not the node's overlay root
        assert lines[-1] == "ran-in-lab-node"
    finally:
        removed = flavoured.down("ctdtest")
    assert any("containerd" in item for item in removed), removed
    assert not flavoured.podman.exists("volume", "gpuboot-ctdtest-cp1-containerd")
