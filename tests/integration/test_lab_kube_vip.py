"""kube-vip for real: `control_plane.mode: kube_vip` on a lab cluster of three control planes
and a worker (kubelet, real kubeadm and the Kubernetes built from Go modules, through the
air-gapped lab mirror), with kube-vip built from its repository's tree at the matrix's tag
(`gpuboot lab operators bundle --kube-vip`) and imported into the mirror as any bundle is.

`gpuboot up` starts kube-vip on the first control plane for `kubeadm init` (super-admin.conf),
moves it to admin.conf, joins the other control planes and the worker through the VIP it holds,
and runs it on every control plane; a second `up` changes nothing; a lost manifest comes back
on that node alone. Then the VIP holder is powered off and the time until the API answers
through the VIP again is measured.

Run whole or reused whole (tests/support/reuse.py): the tests share the cluster, in order."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.mirror.bundle import Bundle
from gpuboot_lab.cluster import LabSpec, container_name
from gpuboot_lab.operators import KUBE_VIP, OperatorBuild, images
from gpuboot_lab.upstream import SOURCE_ROOT, source_git_dir
from tests.integration.conftest import edit_inventory, kubernetes_lab, ssh
from tests.integration.conftest import lab_kubectl as kubectl
from tests.support.reuse import reuse_module
from tests.support.run_events import events_of

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NAME = "kvip"
SUBNET = "10.213.84.0/24"
RELEASE = "k8s-1.36"
CONTROL_PLANES = [f"{NAME}-cp1", f"{NAME}-cp2", f"{NAME}-cp3"]
MANIFEST = "/etc/kubernetes/manifests/kube-vip.yaml"
# Lease 5 s, renew deadline 3 s, retry 1 s: a new holder within seconds, then ARP.
FAILOVER_BUDGET_S = 30


@pytest.fixture(scope="module")
def reused(request):
    yield from reuse_module(request)


@pytest.fixture(scope="module")
def cluster(reused, lab_required, tmp_path_factory):
    if source_git_dir(KUBE_VIP.origin) is None:
        pytest.skip(f"{KUBE_VIP.origin}'s source tree is not on this machine: git clone --bare "
                    f"https://github.com/{KUBE_VIP.origin} {SOURCE_ROOT}/{KUBE_VIP.origin.replace('/', '+')}/repo")
    spec = LabSpec(name=NAME, control_planes=3, workers=1, gpu_workers=0, subnet=SUBNET, flavour="kubernetes",
                   release=RELEASE)
    tmp = tmp_path_factory.mktemp("kvip")
    with kubernetes_lab(tmp, spec) as info:
        bundle = Bundle(tmp / "bundle-kube-vip")
        built = images(bundle, matrix.load(RELEASE), OperatorBuild(log=lambda m: None), (KUBE_VIP,))
        bundle.write_manifest(f"{RELEASE}-kube-vip", built)
        info["lab"].start_mirror(bundle.root)

        def kube_vip(data):
            endpoint = data["all"]["vars"]["gpuboot"]["control_plane"]
            endpoint["mode"] = "kube_vip"
            del endpoint["port"]  # clients reach the holder's own API server: VIP:6443

        info["inventory"] = edit_inventory(info["inventory"], tmp / "kube-vip" / "inventory.yml", kube_vip)
        info["vip"] = yaml.safe_load(info["inventory"].read_text())["all"]["vars"]["gpuboot"]["control_plane"]["vip"]
        yield info


@pytest.fixture(autouse=True)
def _cluster_state(cluster, monkeypatch):
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(cluster["tmp"] / "state"))


def holders(info, hosts: list[str]) -> list[str]:
    return [h for h in hosts if f" {info['vip']}/32" in ssh(info, h, "ip -4 -o addr show").stdout]


def test_up_builds_the_cluster_behind_kube_vip_then_changes_nothing_and_repairs_a_lost_manifest(cluster, capsys):
    inventory = str(cluster["inventory"])
    assert run(["up", inventory, "--to", "cni", "--output", "json"]) == 0, capsys.readouterr().out[-4000:]
    events = events_of(capsys.readouterr().out)
    finished = [e["phase"] for e in events if e["event"] == "PhaseFinished"]
    assert finished.index("control_plane_init") < finished.index("control_plane_join") < finished.index("kube_vip")
    assert "ha_endpoint" in [e["phase"] for e in events if e["event"] == "PhaseSkipped"]

    # The clients' endpoint is the VIP on the API servers' own port; no haproxy, no keepalived.
    server = yaml.safe_load(cluster["kubeconfig"].read_text())["clusters"][0]["cluster"]["server"]
    assert server == f"https://{cluster['vip']}:6443"
    nodes = json.loads(kubectl(cluster, "get", "nodes", "-o", "json").stdout)["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == [*CONTROL_PLANES, f"{NAME}-w1"]
    assert all(next(c for c in n["status"]["conditions"] if c["type"] == "Ready")["status"] == "True" for n in nodes)
    image = matrix.load(RELEASE).images["kube_vip"]["manager"]
    for host in CONTROL_PLANES:
        found = ssh(cluster, host, f"grep -c 'path: /etc/kubernetes/admin.conf' {MANIFEST}; "
                                   "crictl ps --name kube-vip -q | wc -l; systemctl is-active haproxy keepalived; true")
        assert found.stdout.split()[:2] == ["1", "1"], (host, found.stdout, found.stderr)
        assert "active" not in found.stdout.split()[2:], (host, found.stdout)
        pods = json.loads(kubectl(cluster, "get", "pod", "-n", "kube-system", f"kube-vip-{host}", "-o", "json").stdout)
        assert pods["spec"]["containers"][0]["image"] == image
    lease = json.loads(kubectl(cluster, "get", "lease", "-n", "kube-system", "plndr-cp-lock", "-o", "json").stdout)
    holder = holders(cluster, CONTROL_PLANES)
    assert holder == [lease["spec"]["holderIdentity"]], (holder, lease["spec"])

    # Converged: a second run finds every phase's result and runs none.
    assert run(["up", inventory, "--to", "cni", "--output", "json"]) == 0
    events = events_of(capsys.readouterr().out)
    assert [e["phase"] for e in events if e["event"] == "PhaseFinished"] == []

    # The phase owns the manifest: a control plane that lost it gets it back, alone.
    lost = CONTROL_PLANES[1]
    assert ssh(cluster, lost, f"rm {MANIFEST}").returncode == 0
    assert run(["up", inventory, "--to", "cni", "--output", "json"]) == 0
    events = events_of(capsys.readouterr().out)
    assert [e["phase"] for e in events if e["event"] == "PhaseFinished"] == ["preflight", "kube_vip"]
    assert {h for e in events if e["event"] == "PlaybookStats" for h in e["hosts"]} == {lost}
    assert ssh(cluster, lost, f"test -s {MANIFEST}").returncode == 0


def test_losing_the_vip_holder_moves_the_vip_and_the_api_answers_through_it(cluster):
    holder = holders(cluster, CONTROL_PLANES)
    assert len(holder) == 1, holder
    survivors = [h for h in CONTROL_PLANES if h != holder[0]]
    subprocess.run(["podman", "stop", "-t", "0", container_name(NAME, holder[0])], check=True, capture_output=True)
    stopped = time.monotonic()
    while True:
        answer = kubectl(cluster, "get", "nodes", "-o", "name", timeout=3)
        if answer.returncode == 0:
            break
        if time.monotonic() - stopped > 120:
            pytest.fail(f"no answer through the VIP 120 s after {holder[0]} went down: {answer.stderr.strip()}; "
                        f"holders now: {holders(cluster, survivors)}")
        time.sleep(0.5)
    answered_after = time.monotonic() - stopped
    new = holders(cluster, survivors)
    assert len(new) == 1, new
    print(f"\nkube-vip: VIP holder {holder[0]} powered off; {new[0]} took the VIP and the API answered "
          f"through it after {answered_after:.1f} s")
    assert answered_after <= FAILOVER_BUDGET_S, f"{answered_after:.1f} s > {FAILOVER_BUDGET_S} s"
