"""The lab's bad inputs and half-finished states say what is wrong and how to fix it,
and `lab down` cleans up whatever a failed `lab up` left."""
from __future__ import annotations

import json
import subprocess

import pytest

from gpuboot_lab import aptcache, firewall
from gpuboot_lab.cluster import Lab, LabSpec
from gpuboot_lab.errors import LabError
from tests.integration.conftest import LAB_NAME, LAB_SUBNET

pytestmark = pytest.mark.lab


def test_missing_podman_is_named_with_the_fix(monkeypatch, tmp_path):
    import gpuboot_lab.podman as podman_module
    monkeypatch.setattr(podman_module.shutil, "which", lambda name: None)
    with pytest.raises(LabError) as info:
        Lab(tmp_path)
    assert "podman is not installed" in str(info.value) and "apt-get install podman" in str(info.value)


def test_subnet_in_use_is_refused(lab, tmp_path):
    other = Lab(tmp_path / "clash", log=lambda m: None)
    with pytest.raises(LabError, match="overlaps"):
        other.up(LabSpec(name="clash", subnet=LAB_SUBNET), tmp_path / "inv.yml")
    assert not other.podman.exists("network", "gpuboot-clash")


def test_too_many_nodes_for_the_subnet(tmp_path):
    small = Lab(tmp_path, log=lambda m: None)
    with pytest.raises(LabError, match="do not fit"):
        small.up(LabSpec(name="tiny", workers=20, subnet="10.213.77.0/28"), tmp_path / "inv.yml")


def test_half_finished_lab_is_detected_and_cleaned(monkeypatch, tmp_path, lab):
    half = Lab(tmp_path / "half", log=lambda m: None)
    spec = LabSpec(name="half", control_planes=1, workers=0, gpu_workers=1, subnet="10.213.78.0/24")

    def cache_fails(*args, **kwargs):
        raise LabError("apt cache failed (simulated)")
    monkeypatch.setattr(aptcache, "start", cache_fails)
    with pytest.raises(LabError, match="simulated"):
        half.up(spec, tmp_path / "inv.yml")
    # Containers, network and firewall exist now; a second `up` refuses and says what to do.
    assert json.loads(half.state_file.read_text())["status"] == "creating"
    with pytest.raises(LabError) as info:
        half.up(spec, tmp_path / "inv.yml")
    assert "did not finish" in str(info.value) and "gpuboot lab down" in str(info.value)

    removed = half.down("half")
    assert "gpuboot-half-cp1" in removed and "gpuboot-half" in removed
    assert not half.podman.exists("network", "gpuboot-half")
    assert not half.podman.names("container", "io.gpuboot_lab=half")
    assert not firewall.exists("half")
    assert not half.state_file.exists()
    # The running lab was not touched.
    assert lab["lab"].podman.names("container", f"io.gpuboot_lab={LAB_NAME}")


def test_lab_network_is_fenced(lab):
    """Nodes reach each other and this machine; the forward chain drops everything that
    would leave the lab subnet or enter it from outside. (No test sends traffic outside.)"""
    import subprocess

    from tests.integration.conftest import ssh
    inside = ssh(lab, f"{LAB_NAME}-cp1", f"ping -c1 -W2 {LAB_NAME}-w1 >/dev/null && echo ok")
    assert inside.stdout.strip() == "ok"
    rules = subprocess.run(["nft", "list", "table", "inet", firewall.table_name(LAB_NAME)],
                           capture_output=True, text=True, check=True).stdout
    assert f"ip saddr {LAB_SUBNET} ip daddr != {LAB_SUBNET}" in rules and "drop" in rules
    assert f"ip daddr {LAB_SUBNET} ip saddr != {LAB_SUBNET}" in rules
    assert "hook forward priority" in rules


def test_a_lab_whose_state_was_lost_is_cleaned_by_name(tmp_path, lab):
    """A killed run's lab keeps its apt cache listening on the gateway. `lab down --name` from
    any state directory stops it (by what listens on the lab network's gateway), so a new lab
    of that name binds again instead of failing on the port."""
    spec = LabSpec(name="lost", control_planes=1, workers=0, gpu_workers=0, subnet="10.213.76.0/24")
    first = Lab(tmp_path / "first" / "_lab" / "lost", log=lambda m: None)
    state = first.up(spec, tmp_path / "first" / "inv.yml")
    cache = state.acng_pid
    assert cache and f"10.213.76.1:{aptcache.PORT}" in _listening()
    elsewhere = Lab(tmp_path / "elsewhere" / "_lab" / "lost", log=lambda m: None)  # knows no state
    try:
        removed = elsewhere.down("lost")
        assert f"leftover apt-cacher-ng pid {cache} on 10.213.76.1" in removed
        assert f"10.213.76.1:{aptcache.PORT}" not in _listening()
        again = elsewhere.up(spec, tmp_path / "elsewhere" / "inv.yml")
        assert again.acng_pid and again.acng_pid != cache
        # The running lab was not touched.
        assert lab["lab"].podman.names("container", f"io.gpuboot_lab={LAB_NAME}")
    finally:
        elsewhere.down("lost")
        first.down("lost")


def _listening() -> str:
    return subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
