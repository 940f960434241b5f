"""The node-preparation phases end to end over real SSH on every lab node: preflight, os_prep,
container_runtime (the release's containerd.io: containerd 2 and runc built from Go modules,
offered to the nodes in a local apt repository) and kube_packages (stand-in packages from a
TEST DOUBLE repository until the lab builds Kubernetes from Go modules), then a second run
that changes nothing, even after the NVIDIA toolkit has added its containerd drop-in."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpuboot import processes
from gpuboot.cli.main import run
from tests.integration.conftest import edit_inventory, ssh
from tests.support.run_events import events_of

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
RELEASE = yaml.safe_load((ROOT / "mirror" / "releases" / "k8s-1.36.yml").read_text())["gpuboot_release"]
DEBIAN = RELEASE["os"]["debian-12"]
STANDIN = (ROOT / "tests" / "doubles" / "kube_packages" / "standin_repo.py").read_text()
# What toolkit 1.20 writes for containerd 2 where it is not an NRI plugin: its runtime only
# (containerd 2 merges an import key by key).
TOOLKIT_DROPIN = """# stand-in for the NVIDIA container toolkit's drop-in (same shape)
version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
    SystemdCgroup = true
"""
CONTAINERD = DEBIAN["containerd"]["package"]


@pytest.fixture(scope="module")
def prepared_inventory(lab, tmp_path_factory):
    hosts = sorted(lab["state"].addresses)
    for host in hosts:
        result = ssh(lab, host, f"cat > /root/standin_repo.py <<'PY'\n{STANDIN}\nPY\n"
                                f"python3 /root/standin_repo.py {DEBIAN['kube_packages']['version']} /srv/gpuboot-standin")
        assert result.returncode == 0, result.stderr

    def use_standin_repo(data):
        # Host vars: they outrank the playbooks' group_vars mapping of the mirror settings.
        groups = data["all"]["children"]
        for group in (groups["control_plane"], groups["workers"], groups["workers"]["children"]["gpu_workers"]):
            for vars_ in (group.get("hosts") or {}).values():
                vars_["package_source_apt_repository"] = "deb [trusted=yes] file:/srv/gpuboot-standin ./"

    return edit_inventory(lab["inventory"], tmp_path_factory.mktemp("prep") / "inventory.yml", use_standin_repo)


def test_missing_kubernetes_packages_are_explained(lab, capsys):
    """Debian's own sources have no kubeadm: the phase fails and says where packages must come from."""
    assert run(["up", str(lab["inventory"]), "--only", "kube_packages", "--force", "--output", "json"]) == 4
    events = events_of(capsys.readouterr().out)
    assert events[-1]["event"] == "Error" and events[-1]["error"]["exit_code"] == 4  # the last JSON line
    finished = next(e for e in reversed(events) if e["event"] == "RunFinished")
    assert finished["status"] == "failed" and finished["resume"].endswith("--from kube_packages")
    messages = " ".join(f["message"] for f in finished["failures"])
    assert "apt-get (installing kubeadm, kubelet, kubectl) failed with exit 100" in messages
    assert f"must carry exactly kubeadm, kubelet, kubectl {DEBIAN['kube_packages']['version']}" in messages
    assert "gpuboot.mirror.packages_url" in messages


def killed_when(inventory: str, moment, after: float = 0.0) -> list[dict]:
    """Runs `gpuboot up` in its own process and SIGKILLs it (nothing can catch that) at the
    first event `moment` accepts, `after` seconds later; returns the events it had written."""
    proc = subprocess.Popen([str(Path(sys.executable).parent / "gpuboot"), "up", inventory, "--to", "kube_packages",
                             "--output", "json"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    events, phase = [], None
    try:
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            events.append(event)
            phase = event.get("phase", phase)
            if moment(event, phase):
                time.sleep(after)
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, ("the run ended before the moment came", events[-3:])
    return events


def test_gpuboot_killed_at_a_boundary_and_mid_phase_then_a_plain_up_converges(lab, prepared_inventory, capsys):
    """SIGKILL right after a phase finished, then again while apt installs containerd on every
    node (its ansible-playbook and remote apt left running or cut off): a plain `up` stops what
    the killed runs left, is not blocked by their lock, and converges every node."""
    inventory = str(prepared_inventory)
    for host in lab["state"].addresses:  # start from nodes where node preparation must really run
        ssh(lab, host, f"apt-get purge -y -q --allow-change-held-packages {CONTAINERD} kubeadm kubelet kubectl >/dev/null 2>&1; "
                       "rm -rf /etc/containerd; true")
    killed_when(inventory, lambda e, _: e["event"] == "PhaseFinished" and e["phase"] == "os_prep")
    killed_when(inventory, lambda e, phase: e["event"] == "TaskStarted" and phase == "container_runtime"
                and "install containerd" in e["task"], after=3.0)

    assert run(["up", inventory, "--to", "kube_packages", "--output", "json"]) == 0, capsys.readouterr().out[-3000:]
    events = events_of(capsys.readouterr().out)
    ran = [e["phase"] for e in events if e["event"] == "PhaseFinished"]
    assert ran[-2:] == ["container_runtime", "kube_packages"], ran
    stats = [e for e in events if e["event"] == "PlaybookStats"]
    assert all(c["failed"] == 0 and c["unreachable"] == 0 for s in stats for c in s["hosts"].values())
    # What the killed runs left (an orphaned ansible-playbook and its workers) is gone.
    log = Path(next(e["log"] for e in events if e["event"] == "RunStarted"))
    state_root = next(parent.parent for parent in log.parents if parent.name == "runs")
    assert processes.marked(state_root) == []
    version = DEBIAN["kube_packages"]["version"]
    for host in lab["state"].addresses:
        result = ssh(lab, host, "dpkg --audit; systemctl is-active containerd; "
                                f"dpkg-query -W -f='${{Status}}\\n' {CONTAINERD} kubeadm kubelet kubectl; "
                                "dpkg-query -W -f='${Version}\\n' kubeadm; containerd config dump >/dev/null && echo valid")
        assert result.stdout.splitlines() == ["active"] + ["hold ok installed"] * 4 + [version, "valid"], (
            host, result.stdout, result.stderr)

    # Converged: one more plain run finds every phase's result on the hosts and runs nothing.
    assert run(["up", inventory, "--to", "kube_packages", "--output", "json"]) == 0
    events = events_of(capsys.readouterr().out)
    assert [e["phase"] for e in events if e["event"] == "PhaseFinished"] == []
    skipped = [e["phase"] for e in events if e["event"] == "PhaseSkipped"]
    assert skipped[-4:] == ["preflight", "os_prep", "container_runtime", "kube_packages"], skipped

    # kube_packages installs from the package source container_runtime writes: a node that lost
    # it runs container_runtime again, alone, and kube_packages stays skipped.
    lost = sorted(lab["state"].addresses)[-1]
    assert ssh(lab, lost, "rm /etc/apt/sources.list.d/gpuboot-mirror.list").returncode == 0
    assert run(["up", inventory, "--to", "kube_packages", "--output", "json"]) == 0
    events = events_of(capsys.readouterr().out)
    assert [e["phase"] for e in events if e["event"] == "PhaseFinished"] == ["preflight", "container_runtime"]
    assert {h for e in events if e["event"] == "PlaybookStats" for h in e["hosts"]} == {lost}
    source = ssh(lab, lost, "cat /etc/apt/sources.list.d/gpuboot-mirror.list")
    assert source.stdout.strip() == "deb [trusted=yes] file:/srv/gpuboot-standin ./", source.stdout + source.stderr


def test_four_phases_converge_then_a_second_run_changes_nothing(lab, prepared_inventory, capsys):
    inventory = str(prepared_inventory)
    assert run(["up", inventory, "--to", "kube_packages", "--force", "--output", "json"]) == 0
    events = events_of(capsys.readouterr().out)
    assert [e["phase"] for e in events if e["event"] == "PhaseFinished"] == [
        "preflight", "os_prep", "container_runtime", "kube_packages"]
    stats = [e for e in events if e["event"] == "PlaybookStats"]
    assert all(set(s["hosts"]) == set(lab["state"].addresses) for s in stats)
    assert all(c["failed"] == 0 and c["unreachable"] == 0 for s in stats for c in s["hosts"].values())

    for host in lab["state"].addresses:
        result = ssh(lab, host, "systemctl is-active containerd; ctr version >/dev/null && echo ctr-answers; "
                                f"dpkg-query -W -f='${{Version}} ${{Status}}\\n' {CONTAINERD} kubeadm kubelet kubectl; "
                                "systemctl is-enabled kubelet; systemctl is-active kubelet || true; "
                                "containerd config dump | grep -c 'SystemdCgroup = true'")
        lines = result.stdout.splitlines()
        assert lines[:2] == ["active", "ctr-answers"], (host, result.stdout, result.stderr)
        assert lines[2] == f"{DEBIAN['containerd']['version']} hold ok installed", host
        version = DEBIAN["kube_packages"]["version"]
        assert lines[3:6] == [f"{version} hold ok installed"] * 3, (host, lines)
        assert lines[6:8] == ["enabled", "inactive"], (host, lines)
        assert int(lines[8]) >= 1

    # The GPU Operator's toolkit adds its runtime as a drop-in and restarts containerd.
    gpu = next(h for h in lab["state"].addresses if "gpu" in h)
    placed = ssh(lab, gpu, f"cat > /etc/containerd/conf.d/99-nvidia.toml <<'EOF'\n{TOOLKIT_DROPIN}EOF\n"
                           "systemctl restart containerd && sha256sum /etc/containerd/conf.d/99-nvidia.toml")
    assert placed.returncode == 0, placed.stderr
    try:
        assert run(["up", inventory, "--to", "kube_packages", "--force", "--output", "json"]) == 0
        events = events_of(capsys.readouterr().out)
        changed = [(e["host"], e["task"]) for e in events if e["event"] == "HostResult" and e["status"] == "changed"]
        assert changed == []
        after = ssh(lab, gpu, "sha256sum /etc/containerd/conf.d/99-nvidia.toml; containerd config dump")
        assert after.stdout.splitlines()[0] == placed.stdout.splitlines()[-1]
        assert "nvidia-container-runtime" in after.stdout and "SystemdCgroup = true" in after.stdout
    finally:
        # The lab is shared by the session: a later test must not meet this stand-in's runtime.
        ssh(lab, gpu, "rm -f /etc/containerd/conf.d/99-nvidia.toml && systemctl restart containerd")
