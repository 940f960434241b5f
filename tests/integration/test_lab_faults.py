"""Faults inside the Kubernetes phases, on a real cluster in the lab (three control planes and
a worker, built from Go modules and pulled through the lab's air-gapped mirror as in
test_lab_cluster):

- gpuboot SIGKILLed in the middle of every Kubernetes phase (ha_endpoint, kubeadm init while
  its static pods start, a control plane's etcd join, a worker's join, the pod network) and at a
  phase boundary; its ansible-playbook is left running each time, as a SIGKILL leaves it. A
  plain `up` then converges: every node Ready, etcd exactly three started voters, kubeadm's
  cluster objects all there, nothing of the killed runs left running, and a further plain `up`
  runs nothing.
- One control plane cut off by a firewall (every packet in and out of the node dropped) in the
  middle of its join: the run stops within a bounded time naming the node; once the firewall
  is lifted, a plain `up` converges.

(A worker losing power inside its `kubeadm upgrade node` is part of the upgrade in
test_lab_cluster.py: a second upgrade here cost a quarter of an hour.)

The tests share the cluster (module scope) and run in file order."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from gpuboot import processes
from gpuboot.cli.main import run
from gpuboot_lab.cluster import LabSpec, container_name
from tests.integration.conftest import kubernetes_lab, ssh
from tests.support.faults import Firewall
from tests.support.reuse import reuse_module

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NAME = "kfault"
SUBNET = "10.213.87.0/24"
RELEASE = "k8s-1.36"
ROOT = Path(__file__).resolve().parents[2]
CONTROL_PLANES = [f"{NAME}-cp1", f"{NAME}-cp2", f"{NAME}-cp3"]
NODES = [*CONTROL_PLANES, f"{NAME}-w1"]


@pytest.fixture(scope="module")
def reused(request):
    """Skipped whole as REUSED, before its 4-node lab is made, while nothing it depends on
    changed since it passed on this machine (tests/support/reuse.py)."""
    yield from reuse_module(request)


@pytest.fixture(scope="module")
def cluster(reused, lab_required, tmp_path_factory):
    # `lab` first: the shared fixture decides skip-or-fail on machines without the lab.
    spec = LabSpec(name=NAME, control_planes=3, workers=1, gpu_workers=0, subnet=SUBNET, flavour="kubernetes",
                   release=RELEASE)
    with kubernetes_lab(tmp_path_factory.mktemp(NAME), spec) as info:
        yield info


@pytest.fixture
def kfault(cluster, monkeypatch):
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(cluster["tmp"] / "state"))
    return cluster


def _converged(info, capsys) -> None:
    """Each test starts from a whole cluster (the one before may have been reused, not run)."""
    assert run(["up", str(info["inventory"]), "--to", "cni"]) == 0, capsys.readouterr().out[-4000:]
    capsys.readouterr()


def _kubectl(info, *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(info["kubectl"]), "--kubeconfig", str(info["kubeconfig"]),
                           f"--request-timeout={int(timeout)}s", *args],
                          capture_output=True, text=True, timeout=timeout + 5)


def _events(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def _container(node: str) -> str:
    return container_name(NAME, node)


def _wait_until(problems, timeout: float) -> None:
    """Wait until `problems()` returns nothing; fail with its last answer after `timeout` s."""
    deadline = time.monotonic() + timeout
    while found := problems():
        assert time.monotonic() < deadline, found
        time.sleep(3)


def _etcdctl(info, *args: str) -> subprocess.CompletedProcess[str]:
    return _kubectl(info, "-n", "kube-system", "exec", f"etcd-{NAME}-cp1", "--", "etcdctl",
                    "--endpoints=https://127.0.0.1:2379", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
                    "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
                    "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key", *args, "-w", "json", timeout=30)


def _etcd_problems(info) -> list[str]:
    """What keeps etcd from being exactly cp1-cp3, each a started voter that serves ([] if none)."""
    listed = _etcdctl(info, "member", "list")
    if listed.returncode != 0:
        return [f"etcdctl member list: {listed.stderr.strip()[-300:]}"]
    members = json.loads(listed.stdout)["members"]
    found = [f"member {m.get('name') or '(not started)'} is a learner" for m in members if m.get("isLearner")]
    if sorted(m.get("name", "") for m in members) != CONTROL_PLANES:
        found.append(f"members {sorted(m.get('name', '') for m in members)}, not {CONTROL_PLANES}")
    health = _etcdctl(info, "endpoint", "health", "--cluster")
    if not health.stdout.strip().startswith("["):
        return [*found, f"etcdctl endpoint health: {health.stderr.strip()[-300:]}"]
    return found + [f"{e.get('endpoint')}: {e.get('error', 'unhealthy')}" for e in json.loads(health.stdout)
                    if not e.get("health")]


def _cluster_problems(info, kubelet_version: str) -> list[str]:
    """What keeps the cluster from being whole: every node Ready at the version, kubeadm's
    cluster objects (those its last init phases write), kube-proxy on every node, CoreDNS ready."""
    answer = _kubectl(info, "get", "nodes", "-o", "json")
    if answer.returncode != 0:
        return [f"kubectl get nodes: {answer.stderr.strip()[-300:]}"]
    found = []
    nodes = {n["metadata"]["name"]: n for n in json.loads(answer.stdout)["items"]}
    if sorted(nodes) != NODES:
        found.append(f"nodes {sorted(nodes)}")
    for name, node in nodes.items():
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        if ready["status"] != "True":
            found.append(f"{name} not Ready: {ready.get('message', '')}")
        if node["status"]["nodeInfo"]["kubeletVersion"] != kubelet_version:
            found.append(f"{name} runs kubelet {node['status']['nodeInfo']['kubeletVersion']}")
        if node["spec"].get("unschedulable"):
            found.append(f"{name} is cordoned")
    for namespace, kind, name in (("kube-system", "configmap", "kubeadm-config"), ("kube-system", "configmap", "kube-proxy"),
                                  ("kube-system", "configmap", "coredns"), ("kube-public", "configmap", "cluster-info"),
                                  ("kube-system", "daemonset", "kube-proxy"), ("kube-system", "deployment", "coredns")):
        if _kubectl(info, "-n", namespace, "get", kind, name).returncode != 0:
            found.append(f"{namespace}/{kind}/{name} is missing")
    proxy = _kubectl(info, "-n", "kube-system", "get", "daemonset", "kube-proxy", "-o", "json")
    if proxy.returncode == 0 and json.loads(proxy.stdout)["status"].get("numberReady") != len(NODES):
        found.append(f"kube-proxy ready on {json.loads(proxy.stdout)['status'].get('numberReady')} nodes")
    dns = _kubectl(info, "-n", "kube-system", "get", "deployment", "coredns", "-o", "json")
    if dns.returncode == 0 and not json.loads(dns.stdout)["status"].get("readyReplicas"):
        found.append("CoreDNS has no ready replica")
    return found


class KilledRun:
    """`gpuboot up --to cni` in its own process, SIGKILLed (nothing can catch that) once an event
    passes `moment` and then, if given, a shell test passes on `node` (asked over SSH): the
    run's ansible-playbook is left running, as a real SIGKILL leaves it."""

    def __init__(self, info, moment, node: str | None = None, remote: str | None = None, after: float = 0.0,
                 then: str | None = None, timeout: float = 900):
        self.info, self.moment, self.node, self.remote, self.after = info, moment, node, remote, after
        self.then = then  # run on the node right after the kill
        self.timeout = timeout
        self.events: list[dict] = []
        self._seen = threading.Event()

    def _drain(self, proc: subprocess.Popen) -> None:
        phase = None
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            phase = event.get("phase", phase)
            event.setdefault("phase", phase)
            self.events.append(event)
            if self.moment(event):
                self._seen.set()

    def __call__(self) -> list[dict]:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "gpuboot"), "up", str(self.info["inventory"]),
                                 "--to", "cni", "--output", "json"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        reader = threading.Thread(target=self._drain, args=(proc,), daemon=True)
        reader.start()
        deadline = time.monotonic() + self.timeout
        try:
            while not self._seen.wait(0.5):
                assert proc.poll() is None, ("the run ended before the moment came", self.events[-3:])
                assert time.monotonic() < deadline, ("the moment never came", self.events[-3:])
            time.sleep(self.after)
            while self.remote:
                answer = ssh(self.info, self.node, f"if {self.remote} >/dev/null; then echo HIT; fi")
                if "HIT" in answer.stdout:
                    break
                assert proc.poll() is None, (f"the run ended before `{self.remote}` held on {self.node}",
                                             self.events[-3:])
                assert time.monotonic() < deadline, (f"`{self.remote}` never held on {self.node}", self.events[-3:])
                time.sleep(0.3)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            if self.then:
                ssh(self.info, self.node, self.then)
        finally:
            if proc.poll() is None:
                proc.kill()
        reader.join(timeout=30)
        assert proc.returncode == -signal.SIGKILL, ("the run ended before the moment came", self.events[-3:])
        return self.events


def _task_in(phase: str, words: str):
    return lambda e: e["event"] == "TaskStarted" and e.get("phase") == phase and words in e.get("task", "")


def test_killed_inside_every_kubernetes_phase_then_a_plain_up_converges(kfault, capsys):
    info, inventory = kfault, str(kfault["inventory"])
    # Node preparation first (its own kills are test_node_prep_phases').
    assert run(["up", inventory, "--to", "kube_packages"]) == 0, capsys.readouterr().out[-3000:]
    capsys.readouterr()
    kills = {
        "ha_endpoint, mid-phase": KilledRun(info, _task_in("ha_endpoint", "install haproxy"), after=2.0),
        # kubeadm has written admin.conf (its kubeconfig phase) and waits for its static pods:
        # the cluster's objects (kubeadm-config, RBAC, tokens, kube-proxy, CoreDNS) come later.
        # kubeadm dies with gpuboot here (as when the node reboots), so its init stays unfinished.
        "control_plane_init, kubeadm init half done": KilledRun(
            info, _task_in("control_plane_init", "kubeadm init"), node=f"{NAME}-cp1",
            remote="[ -f /etc/kubernetes/admin.conf ] && pgrep -x kubeadm", then="pkill -9 -x kubeadm; true"),
        "after control_plane_init": KilledRun(
            info, lambda e: e["event"] == "PhaseFinished" and e.get("phase") == "control_plane_init"),
        # kubelet.conf written, kubeadm still joining etcd (a learner, not yet promoted).
        "control_plane_join, cp2 joining etcd": KilledRun(
            info, _task_in("control_plane_join", "kubeadm join"), node=f"{NAME}-cp2",
            remote="[ -f /etc/kubernetes/kubelet.conf ] && pgrep -x kubeadm"),
        "workers_join, w1 joining": KilledRun(
            info, _task_in("workers_join", "kubeadm join"), node=f"{NAME}-w1", remote="pgrep -x kubeadm"),
        "cni, mid-phase": KilledRun(info, lambda e: e["event"] == "TaskStarted" and e.get("phase") == "cni", after=3.0),
    }
    ran_before, finished_init = {}, []
    for moment, killed in kills.items():
        events = killed()
        ran_before[moment] = [e["phase"] for e in events if e["event"] == "PhaseStarted"]
        finished_init += [e for e in events if e["event"] == "HostResult" and e["status"] == "changed"
                          and "kubeadm init past its preflight" in e["task"]]
    # The run after the half-done init found admin.conf without kubeadm's last objects and
    # finished the init (nothing reset), rather than taking admin.conf for a cluster.
    assert [e["host"] for e in finished_init] == [f"{NAME}-cp1"], ran_before
    print(f"\nkilled runs, each the phases it started: {ran_before}")

    t0 = time.monotonic()
    assert run(["up", inventory, "--to", "cni", "--output", "json"]) == 0, capsys.readouterr().out[-5000:]
    converged_in = time.monotonic() - t0
    events = _events(capsys.readouterr().out)
    stats = [e for e in events if e["event"] == "PlaybookStats"]
    assert all(c["failed"] == 0 and c["unreachable"] == 0 for s in stats for c in s["hosts"].values()), stats
    _wait_until(lambda: _cluster_problems(info, info["version"]) + _etcd_problems(info), timeout=240)
    # What the killed runs left on the control machine is gone, and no kubeadm runs on a node.
    state_root = info["tmp"] / "state"
    assert processes.marked(state_root) == []
    for node in NODES:
        assert ssh(info, node, "pgrep -a -x kubeadm").stdout == "", node
    # Converged: a further plain run finds every phase's result on the hosts and runs nothing.
    assert run(["up", inventory, "--to", "cni", "--output", "json"]) == 0
    assert [e["phase"] for e in _events(capsys.readouterr().out) if e["event"] == "PhaseStarted"] == []
    print(f"after {len(kills)} SIGKILLs a plain up converged in {converged_in:.0f}s")


def _survivors_view(info, lost: str) -> str:
    """What a person would look at when the API does not answer with one control plane lost:
    per surviving control plane, whether it holds the VIP, its own API server's failing checks,
    its etcd's health (etcd's own /health on its metrics port), haproxy's last words."""
    vip = yaml.safe_load(info["inventory"].read_text())["all"]["vars"]["gpuboot"]["control_plane"]["vip"]
    lines = []
    for host in (h for h in CONTROL_PLANES if h != lost):
        answer = ssh(info, host, f"ip -4 -o addr show | grep -c ' {vip}/'; "
                                 "kubectl --kubeconfig /etc/kubernetes/admin.conf --server https://127.0.0.1:6443 "
                                 "--insecure-skip-tls-verify --request-timeout=5s get --raw '/readyz?verbose' 2>&1 "
                                 "| grep -v '\\[+\\]'; python3 -c \"import urllib.request as u; "
                                 "print('etcd', u.urlopen('http://127.0.0.1:2381/health', timeout=5).read().decode())\" 2>&1 "
                                 "| tail -1; journalctl -u haproxy --since '-3min' --no-pager -o cat | tail -8")
        lines.append(f"--- {host} (VIP held: first line)\n{answer.stdout.strip()}")
    return "\n".join(lines)


def test_a_control_plane_cut_off_by_a_firewall_during_its_join_then_a_plain_up_converges(kfault, capsys):
    info, inventory, cp3 = kfault, str(kfault["inventory"]), f"{NAME}-cp3"
    _converged(info, capsys)
    assert run(["node", "remove", inventory, cp3, "--yes-remove-it"]) == 0, capsys.readouterr().out[-4000:]
    capsys.readouterr()
    # The plain `up` joins cp3 again; the moment its kubeadm join is under way with kubelet.conf
    # written (it is joining etcd), every packet to and from cp3 is dropped.
    cut = Firewall(info, cp3, _container(cp3), "[ -f /etc/kubernetes/kubelet.conf ] && pgrep -x kubeadm")
    t0 = time.monotonic()
    with cut:
        code = run(["up", inventory, "--to", "cni", "--output", "json"])
    stopped_after = time.monotonic() - t0
    said = capsys.readouterr().out
    assert cut.cut_after is not None, "cp3's join was never seen between kubelet.conf and its end"
    assert code != 0, said[-4000:]
    # Bounded: ssh's keepalive (ServerAliveInterval 15 x 4) gives up on the silent node.
    assert stopped_after - cut.cut_after < 240, (stopped_after, cut.cut_after)
    finished = next(e for e in _events(said) if e["event"] == "RunFinished")
    failures = " ".join(f"{f.get('host', '')}: {f['message']}" for f in finished["failures"])
    assert cp3 in failures, finished
    # ssh's own words (asked again: Ansible's were that data could not be sent) and what to look at.
    assert "does not answer on SSH" in failures, failures
    # The cluster kept its quorum and its API through the VIP while cp3 was cut off.
    try:
        _wait_until(lambda: [] if _kubectl(info, "get", "--raw", "/readyz", timeout=10).returncode == 0
                    else ["no answer through the VIP"], timeout=90)
    except AssertionError:
        pytest.fail(f"the API did not answer through the VIP with {cp3} cut off:\n{_survivors_view(info, cp3)}")
    cut.lift()
    t1 = time.monotonic()
    assert run(["up", inventory, "--to", "cni"]) == 0, capsys.readouterr().out[-5000:]
    converged_in = time.monotonic() - t1
    _wait_until(lambda: _cluster_problems(info, info["version"]) + _etcd_problems(info), timeout=240)
    for node in NODES:
        assert ssh(info, node, "pgrep -a -x kubeadm").stdout == "", node
    print(f"\ncp3 cut off {cut.cut_after:.0f}s into the run, mid-join; the run stopped "
          f"{stopped_after - cut.cut_after:.0f}s later naming it ({failures[:300]}); a plain up converged in "
          f"{converged_in:.0f}s")
