"""A real cluster in the lab, and its day 2: five privileged lab nodes (kind's settings)
with the Kubernetes built from Go modules (`gpuboot lab kubernetes bundle`: kubeadm's
images and the .debs), imported with `mirror import` and installed and pulled by the nodes
through an air-gapped mirror exactly as in production; `gpuboot up` runs real keepalived/haproxy, `kubeadm init`, two control-plane joins
and two worker joins behind the VIP, and the bridge CNI; every node becomes Ready. A
second `up` changes nothing. Then `gpuboot upgrade` takes it to the next release of the matrix
for real (1.36 -> 1.37, through the same mirror) while a probe reads through the VIP every 200 ms
and a Deployment keeps its PodDisruptionBudget. Last, the VIP holder is stopped and the API still
answers through the VIP.

The tests share one cluster (module scope: building it is most of their time) and run in file
order, each starting from the state the one before left.

Needs the build cache for the lab inventory's Kubernetes version: CI builds it (step 3's
tests need it too); elsewhere the test is skipped with the command that builds it."""
from __future__ import annotations

import base64
import fnmatch
import json
import stat
import subprocess
import time

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.phases.catalog import cis_file_modes
from gpuboot_lab import artifacts as lab_artifacts
from gpuboot_lab.cluster import LabSpec, container_name
from tests.integration.conftest import built_kubectl, kubernetes_lab, lab_kubectl, ssh
from tests.support.faults import PowerCut, freeze_when_seen
from tests.support.probe import ApiProbe
from tests.support.reuse import reuse_module

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NAME = "kcluster"
SUBNET = "10.213.82.0/24"
RELEASE = "k8s-1.36"  # the lab inventory's


@pytest.fixture(scope="module")
def reused(request):
    """The module's tests run in order, each from the state the one before left (the upgrade,
    the etcd restore, nodes out and in, reset): it is run whole or skipped whole as REUSED,
    while nothing it depends on changed since it passed on this machine
    (tests/support/reuse.py; GPUBOOT_TESTS_FRESH=1 runs it)."""
    yield from reuse_module(request)


@pytest.fixture(scope="module")
def cluster(reused, lab_required, tmp_path_factory):
    # `lab` first: the shared fixture decides skip-or-fail on machines without the lab.
    spec = LabSpec(name=NAME, control_planes=3, workers=2, gpu_workers=0, subnet=SUBNET, flavour="kubernetes",
                   release=RELEASE)
    with kubernetes_lab(tmp_path_factory.mktemp("kcluster"), spec) as info:
        yield info


@pytest.fixture(autouse=True)
def _cluster_state(cluster, monkeypatch):
    """Every test of this module uses the cluster's own state directory (runs, lock, snapshots)."""
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(cluster["tmp"] / "state"))


_kubectl = lab_kubectl


def _phase_changes(info) -> dict[str, int]:
    record = json.loads((info["kubeconfig"].parent / "state.json").read_text())["phases"]
    return {name: entry["changed"] for name, entry in record.items()}


def _cis_files(info, node: str) -> dict[str, tuple[int, int, int]]:
    """Every file the CIS file-permission entries name on the node, as stat sees it there:
    path -> (mode, uid, gid). Judged here, apart from the module that tightens them."""
    lists = ("node", "control_plane") if "-cp" in node else ("node",)
    globs = [entry["path"] for name in lists for entry in cis_file_modes()[name]]
    answer = ssh(info, node, "stat -c '%a %u %g %n' " + " ".join(globs) + " 2>/dev/null; true").stdout
    return {path: (int(mode, 8), int(uid), int(gid))
            for mode, uid, gid, path in (line.split(" ", 3) for line in answer.splitlines())}


def _cis_loose(info, node: str) -> list[str]:
    lists = ("node", "control_plane") if "-cp" in node else ("node",)
    entries = [entry for name in lists for entry in cis_file_modes()[name]]
    loose = []
    for path, (mode, uid, gid) in _cis_files(info, node).items():
        allowed = next(int(e["mode"], 8) for e in entries if fnmatch.fnmatchcase(path, e["path"]))
        if mode & ~allowed or (uid, gid) != (0, 0):
            loose.append(f"{node}:{path} {mode:04o} {uid}:{gid}")
    return loose


def _vip_holder(info, control_planes: list[str], vip: str) -> str:
    holders = [h for h in control_planes if f" {vip}/" in ssh(info, h, "ip -4 -o addr show").stdout]
    assert len(holders) == 1, f"VIP {vip} held by {holders}"
    return holders[0]


def test_gpuboot_up_builds_a_real_ha_cluster_that_converges_and_repairs(cluster, capsys):
    t0 = time.monotonic()
    assert run(["up", str(cluster["inventory"]), "--to", "cni"]) == 0, capsys.readouterr().out[-4000:]
    first_up = time.monotonic() - t0
    terminal = capsys.readouterr().out

    # The packages came from the mirror's signed repository at the built version.
    node = f"{NAME}-w1"
    versions = ssh(cluster, node, "kubeadm version -o short; kubelet --version; kubectl version --client | head -1; "
                                  "ls /opt/cni/bin | tr '\\n' ' '; echo; apt-cache policy kubeadm | grep -m1 https; "
                                  "crictl --version; containerd --version; runc --version | head -1")
    lines = versions.stdout.splitlines()
    version = cluster["version"]
    assert lines[:3] == [version, f"Kubernetes {version}", f"Client Version: {version}"], versions.stdout
    assert {"bridge", "host-local", "loopback", "portmap"} <= set(lines[3].split())
    assert lines[4].split()[1].startswith(f"https://{cluster['packages']}/"), lines[4]
    # crictl came with kubeadm, as upstream's packages bring it: the operator's first tool on a node.
    crictl = matrix.load(RELEASE).model_extra["lab_build"]["cri_tools"]["version"]
    assert lines[5] == f"crictl version {crictl}", versions.stdout
    # containerd 2 and runc, built from Go modules and installed as containerd.io from the mirror.
    lab_build = matrix.load(RELEASE).model_extra["lab_build"]
    assert lines[6].split()[2] == lab_build["containerd"]["version"], versions.stdout
    assert lines[7] == f"runc version {lab_build['runc']['version'].lstrip('v')}", versions.stdout

    # The admin kubeconfig on the control machine: private, pointing at the VIP.
    kubeconfig = cluster["kubeconfig"]
    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
    settings = yaml.safe_load(cluster["inventory"].read_text())["all"]["vars"]["gpuboot"]
    vip, port = settings["control_plane"]["vip"], settings["control_plane"]["port"]
    assert yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == f"https://{vip}:{port}"

    nodes = json.loads(_kubectl(cluster, "get", "nodes", "-o", "json").stdout)["items"]
    names = sorted(n["metadata"]["name"] for n in nodes)
    assert names == [f"{NAME}-cp1", f"{NAME}-cp2", f"{NAME}-cp3", f"{NAME}-w1", f"{NAME}-w2"]
    for node in nodes:
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", (node["metadata"]["name"], ready)
        assert node["status"]["nodeInfo"]["kubeletVersion"] == cluster["version"]
    control_planes = sorted(n["metadata"]["name"] for n in nodes
                            if "node-role.kubernetes.io/control-plane" in n["metadata"]["labels"])
    assert control_planes == names[:3]

    # Three etcd members and API servers, from the mirror by its own name; kube-proxy on
    # every node; CoreDNS ready (it reaches the API through a Service, so kube-proxy works).
    pods = json.loads(_kubectl(cluster, "-n", "kube-system", "get", "pods", "-o", "json").stdout)["items"]

    def running(prefix: str) -> list[dict]:
        return [p for p in pods if p["metadata"]["name"].startswith(prefix) and p["status"]["phase"] == "Running"]
    assert len(running("etcd-")) == 3 and len(running("kube-apiserver-")) == 3
    assert len(running("kube-proxy-")) == 5
    api_image = running("kube-apiserver-")[0]["spec"]["containers"][0]["image"]
    assert api_image == f"{cluster['mirror']}/registry.k8s.io/kube-apiserver:{cluster['version']}"
    deadline = time.monotonic() + 120
    while True:
        dns = json.loads(_kubectl(cluster, "-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns",
                                  "-o", "json").stdout)["items"]
        if dns and all(all(c["ready"] for c in p["status"].get("containerStatuses", [{"ready": False}]))
                       for p in dns):
            break
        assert time.monotonic() < deadline, [p["status"] for p in dns]
        time.sleep(3)

    # The CIS file-permission items hold on every node: kubeadm leaves the PKI certificates,
    # kubelet's config.yaml and the kubelet unit files at 0644; the phases tighten them.
    for node in names:
        files = _cis_files(cluster, node)
        assert {"/etc/kubernetes/kubelet.conf", "/etc/kubernetes/pki/ca.crt", "/var/lib/kubelet/config.yaml",
                "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf"} <= set(files), (node, sorted(files))
        if node in control_planes:
            assert {"/etc/kubernetes/pki/apiserver.crt", "/etc/kubernetes/pki/etcd/server.key",
                    "/etc/kubernetes/manifests/etcd.yaml", "/var/lib/etcd"} <= set(files), (node, sorted(files))
    assert [line for node in names for line in _cis_loose(cluster, node)] == []

    # Re-running is safe: the cluster phases run again (--force) and change nothing (node
    # preparation's second run is checked in test_node_prep_phases).
    t1 = time.monotonic()
    assert run(["up", str(cluster["inventory"]), "--from", "ha_endpoint", "--to", "cni", "--force"]) == 0, \
        capsys.readouterr().out[-4000:]
    second_up = time.monotonic() - t1
    rerun = ("ha_endpoint", "control_plane_init", "control_plane_join", "workers_join", "cni")
    recorded = _phase_changes(cluster)
    assert set(rerun) <= set(recorded)
    changes = {name: recorded[name] for name in rerun if recorded[name]}
    assert changes == {}, f"a second up changed things: {changes}"

    # Convergence follows the hosts: a stopped and disabled kubelet on a joined worker and a
    # deleted containerd configuration are found and repaired by a plain `up` (no --force),
    # and only the phases whose result is gone run again.
    ssh(cluster, f"{NAME}-w2", "systemctl disable --now kubelet")
    ssh(cluster, f"{NAME}-w1", "rm /etc/containerd/config.toml")
    # ...and a control plane's key and kubelet config loosened (as a `kubeadm certs renew` or a
    # hand edit leaves them) are tightened again.
    ssh(cluster, f"{NAME}-cp3", "chmod 0644 /etc/kubernetes/pki/apiserver.key /var/lib/kubelet/config.yaml")
    t2 = time.monotonic()
    assert run(["up", str(cluster["inventory"]), "--to", "cni", "--output", "json"]) == 0, \
        capsys.readouterr().out[-4000:]
    repair_up = time.monotonic() - t2
    repair_output = capsys.readouterr().out
    events = [json.loads(line) for line in repair_output.splitlines() if line.startswith("{")]
    started = {e["phase"]: e["reason"] for e in events if e["event"] == "PhaseStarted"}
    assert set(started) == {"preflight", "container_runtime", "control_plane_join", "workers_join", "cni"}, started
    # Each repair ran on the hosts that lost its result, and on the first control plane where
    # its plays need it (a join's credentials); the pod network, whose routes name every node's
    # pods, and so preflight, on every node.
    touched = _touched(repair_output)
    cp1, cp3, w1, w2 = (f"{NAME}-{h}" for h in ("cp1", "cp3", "w1", "w2"))
    assert touched["container_runtime"] == {w1}, touched
    assert cp3 in touched["control_plane_join"] <= {cp3, cp1}, touched
    assert w2 in touched["workers_join"] <= {w2, cp1}, touched
    assert set(names) <= touched["cni"] and set(names) <= touched["preflight"], touched
    assert "; only on " in started["container_runtime"] and "; only on " not in started["cni"], started
    assert "config.toml is missing" in started["container_runtime"]
    assert "kubelet is" in started["workers_join"]
    assert started["control_plane_join"].startswith(f"{NAME}-cp3: /var/lib/kubelet/config.yaml is mode 0644, CIS 4.1.9"), \
        started["control_plane_join"]
    skipped = {e["phase"] for e in events if e["event"] == "PhaseSkipped"}
    assert {"os_prep", "kube_packages", "ha_endpoint", "control_plane_init"} <= skipped
    assert _cis_loose(cluster, f"{NAME}-cp3") == []
    assert ssh(cluster, f"{NAME}-w2", "systemctl is-enabled kubelet; systemctl is-active kubelet").stdout.split() \
        == ["enabled", "active"]
    assert "SystemdCgroup = true" in ssh(cluster, f"{NAME}-w1", "cat /etc/containerd/config.toml").stdout
    # And once repaired, a plain up asks the hosts and runs nothing.
    assert run(["up", str(cluster["inventory"]), "--to", "cni", "--output", "json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [e for e in events if e["event"] == "PhaseStarted"] == []

    # The bootstrap tokens this run made exist in the cluster; none of them, nor the lab
    # mirror's password, is in any file gpuboot wrote (run logs, runner artifacts, state)
    # or in its terminal output.
    secrets = json.loads(_kubectl(cluster, "-n", "kube-system", "get", "secrets", "--field-selector",
                                  "type=bootstrap.kubernetes.io/token", "-o", "json").stdout)["items"]
    tokens = [base64.b64decode(s["data"]["token-secret"]).decode() for s in secrets]
    assert len(tokens) >= 2  # one for the control-plane joins, one for the workers
    terminal += capsys.readouterr().out
    password = json.loads((cluster["lab"].dir / "mirror" / "secrets" / "mirror.json").read_text())["password"]
    for path in (cluster["kubeconfig"].parent).rglob("*"):
        if path.is_file() and path.name != "admin.conf":
            text = path.read_text(errors="replace")
            assert not any(t in text for t in tokens), f"a join token is in {path}"
            assert password not in text, f"the mirror password is in {path}"
    assert not any(t in terminal for t in tokens) and password not in terminal
    print(f"\nreal cluster: first up {first_up:.0f}s, second up {second_up:.0f}s (0 changes), repair up "
          f"{repair_up:.0f}s (stopped kubelet, deleted containerd config)")



UPGRADE_TO = "k8s-1.37"
WORKLOAD = """
apiVersion: v1
kind: Namespace
metadata: {name: upgrade-probe}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: upgrade-probe}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: web
          image: registry.k8s.io/e2e-test-images/agnhost:2.53
          args: [netexec, --http-port=8080]
          # Five lab nodes share this machine's two cores: while a control plane restarts,
          # an answer can take seconds. What is under test is the budget during drains,
          # not the machine's CPU, so a slow answer is not a failed one.
          readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 2, timeoutSeconds: 5, failureThreshold: 3}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: upgrade-probe}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: web}}
"""
# A workload pinned to the canary (w1) that cannot run: it crash-loops there before the upgrade
# too (the checks before an upgrade judge the cluster, not each workload), and after the
# canary's upgrade its pod comes back and crash-loops within the gate's settle time.
CRASHER = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: crasher, namespace: upgrade-probe}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: crasher}}}}
  template:
    metadata: {{labels: {{app: crasher}}}}
    spec:
      nodeSelector: {{kubernetes.io/hostname: {NAME}-w1}}
      terminationGracePeriodSeconds: 1
      containers:
        - name: crasher
          image: registry.k8s.io/e2e-test-images/agnhost:2.53
          args: [no-such-command]
"""
STRICT_BUDGET = """
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: strict, namespace: upgrade-probe}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
"""


def _apply(info, manifest: str, *verb: str) -> None:
    done = subprocess.run([str(info["kubectl"]), "--kubeconfig", str(info["kubeconfig"]), *(verb or ("apply",)),
                           "-f", "-"], input=manifest, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _wait_for(info, what: str, test, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while True:
        answer = _kubectl(info, *what.split(), "-o", "json")
        body = json.loads(answer.stdout) if answer.returncode == 0 else None
        if body is not None and test(body):
            return body
        assert time.monotonic() < deadline, f"{what}: {answer.stdout[-2000:] or answer.stderr}"
        time.sleep(2)


def _all_five_nodes_ready(info) -> None:
    _wait_for(info, "get nodes", lambda body: len(body["items"]) == 5 and all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"]) for n in body["items"]),
        timeout=240)


def test_upgrade_to_the_next_release_for_real_with_the_api_and_a_budgeted_deployment_available(cluster, capsys):
    inventory = str(cluster["inventory"])
    from_version, to_version = cluster["version"], matrix.load(UPGRADE_TO).kubernetes.version
    built_kubectl(to_version)
    # The next release enters the same mirror as any bundle does.
    bundle = cluster["tmp"] / "bundle-next"
    lab_artifacts.write(to_version, bundle, log=lambda m: None)
    cluster["lab"].start_mirror(bundle)
    _apply(cluster, WORKLOAD)
    _wait_for(cluster, "-n upgrade-probe get deployment web", lambda d: d["status"].get("availableReplicas") == 2)

    # A budget that allows no eviction is refused before anything changes, by name.
    _apply(cluster, STRICT_BUDGET)
    _wait_for(cluster, "-n upgrade-probe get pdb strict", lambda b: b.get("status", {}).get("expectedPods") == 2)
    assert run(["upgrade", inventory, "--to", UPGRADE_TO]) == 4
    said = capsys.readouterr()
    assert "PodDisruptionBudget upgrade-probe/strict allows no disruption" in said.out + said.err
    record = json.loads((cluster["kubeconfig"].parent / "state.json").read_text())
    assert record["phases"]["upgrade_preflight"]["status"] == "failed" and "etcd_snapshot" not in record["phases"]
    assert not list((cluster["kubeconfig"].parent / "etcd-snapshots").glob("*.db"))
    _apply(cluster, STRICT_BUDGET, "delete")

    # The upgrade itself, while a probe reads through the VIP every 200 ms. A workload that
    # cannot run on the canary stops the run at the canary's gate: the control planes and the
    # canary are upgraded, w2 is not touched, and the run says what and how to go on.
    _apply(cluster, CRASHER)
    t0 = time.monotonic()
    with ApiProbe(cluster["kubeconfig"], ("upgrade-probe", "app=web")) as probe:
        code = run(["upgrade", inventory, "--to", UPGRADE_TO, "--gate-timeout", "120"])
        stopped = capsys.readouterr()
        assert code == 4, stopped.out[-5000:]
        said = stopped.out + stopped.err
        assert f"{NAME}-w1" in said and "upgrade-probe/crasher-" in said and "is crash-looping" in said, said[-5000:]
        assert f"gpuboot upgrade {inventory} --to {UPGRADE_TO} --resume" in said
        record = json.loads((cluster["kubeconfig"].parent / "state.json").read_text())["phases"]
        assert record["upgrade_control_planes"]["status"] == "ok" and record["upgrade_workers"]["status"] == "failed"
        kubelets = {n["metadata"]["name"]: n["status"]["nodeInfo"]["kubeletVersion"]
                    for n in json.loads(_kubectl(cluster, "get", "nodes", "-o", "json").stdout)["items"]}
        assert kubelets == {**{f"{NAME}-{h}": to_version for h in ("cp1", "cp2", "cp3", "w1")},
                            f"{NAME}-w2": from_version}, kubelets
        # Without --resume, a second run is refused before it changes anything.
        assert run(["upgrade", inventory, "--to", UPGRADE_TO]) == 4
        assert "is in progress" in "".join(capsys.readouterr())
        # The operator removes the broken workload and continues: the upgraded nodes are only
        # gated again, w2 is drained and upgraded. w2 loses power while kubeadm upgrades it: the
        # run stops naming w2 and says how to go on; once w2 is back, --resume finishes.
        _apply(cluster, CRASHER, "delete")
        w2 = f"{NAME}-w2"
        seen = freeze_when_seen(cluster, w2, "kubeadm upgrade nod[e]", "/run/gpuboot-fault-kubeadm-seen")
        cut = PowerCut(cluster, w2, container_name(NAME, w2), seen, timeout=1800)
        with cut:
            code = run(["upgrade", inventory, "--to", UPGRADE_TO, "--resume", "--output", "json"])
        lost = capsys.readouterr().out
        assert cut.cut_after is not None, "w2's kubeadm upgrade step was never seen"
        assert code != 0, lost[-4000:]
        finished = next(json.loads(line) for line in lost.splitlines()
                        if line.startswith('{"event": "RunFinished"'))
        failures = " ".join(f"{f.get('host', '')}: {f['message']}" for f in finished["failures"])
        assert w2 in failures and finished["resume"] and "--resume" in finished["resume"], finished
        record = json.loads((cluster["kubeconfig"].parent / "state.json").read_text())["phases"]
        assert record["upgrade_workers"]["status"] == "failed"
        cut.power_on()
        code = run(["upgrade", inventory, "--to", UPGRADE_TO, "--resume"])
    took = time.monotonic() - t0
    terminal = capsys.readouterr().out
    assert code == 0, terminal[-5000:]
    assert f"runs {to_version}" in terminal and f"gpuboot.release: {UPGRADE_TO}" in terminal
    figures = probe.figures

    # The inventory still names the old release: `up` refuses to move the packages back. The
    # inventory then names the release the cluster runs, whatever the checks below find, so the
    # later tests meet the cluster as it is.
    try:
        assert run(["up", inventory, "--to", "kube_packages"]) == 4
        said = capsys.readouterr()
        assert "the cluster was upgraded" in said.out + said.err
    finally:
        data = yaml.safe_load(cluster["inventory"].read_text())
        data["all"]["vars"]["gpuboot"]["release"] = UPGRADE_TO
        cluster["inventory"].write_text(yaml.safe_dump(data, sort_keys=False))
        cluster["version"] = to_version

    nodes = json.loads(_kubectl(cluster, "get", "nodes", "-o", "json").stdout)["items"]
    assert {n["metadata"]["name"]: n["status"]["nodeInfo"]["kubeletVersion"] for n in nodes} == \
        {f"{NAME}-{h}": to_version for h in ("cp1", "cp2", "cp3", "w1", "w2")}
    assert not any(n["spec"].get("unschedulable") for n in nodes)
    pods = json.loads(_kubectl(cluster, "-n", "kube-system", "get", "pods", "-o", "json").stdout)["items"]
    statics = [p for p in pods if p["metadata"]["name"].startswith(("kube-apiserver-", "kube-controller-manager-",
                                                                    "kube-scheduler-", "kube-proxy-"))]
    assert len(statics) == 3 * 3 + 5
    assert {p["spec"]["containers"][0]["image"].rsplit(":", 1)[1] for p in statics} == {to_version}
    on_node = ssh(cluster, f"{NAME}-w2", "kubeadm version -o short; apt-mark showhold | sort | tr '\\n' ' '")
    assert on_node.stdout.split("\n")[0] == to_version
    assert {"kubeadm", "kubectl", "kubelet", "containerd.io"} <= set(on_node.stdout.split("\n")[1].split())
    # containerd moved to the target release's minor on every node, inside its drained window.
    target = matrix.load(UPGRADE_TO)
    for n in nodes:
        runtime = ssh(cluster, n["metadata"]["name"], "containerd --version; dpkg-query -W -f='${Version}' containerd.io")
        said_version = runtime.stdout.splitlines()
        assert said_version[0].split()[2] == target.model_extra["lab_build"]["containerd"]["version"], runtime.stdout
        assert said_version[1] == target.os["debian-12"].containerd["version"], runtime.stdout
    # (containerd's CRI reports its version without the tag's "v".)
    assert {n["status"]["nodeInfo"]["containerRuntimeVersion"] for n in nodes} == {
        f"containerd://{target.model_extra['lab_build']['containerd']['version'].removeprefix('v')}"}
    # kubeadm's upgrade rewrote kubelet's config.yaml and the packages their unit files (0644):
    # the upgrade tightened them again on every node.
    assert [line for n in nodes for line in _cis_loose(cluster, n["metadata"]["name"])] == []

    # The snapshot taken first by each run that passed its checks (the gate stop, the power cut,
    # the finish): on the control machine, private, with what etcdutl read from it; the first
    # holds the cluster as it was before the upgrade.
    snapshots = sorted((cluster["kubeconfig"].parent / "etcd-snapshots").glob("*.db"))
    assert len(snapshots) == 3 and all(stat.S_IMODE(s.stat().st_mode) == 0o600 for s in snapshots)
    status = json.loads(snapshots[0].with_suffix(".json").read_text())["status"]
    assert status["totalKey"] > 100 and status["revision"] > 0 and status["totalSize"] > 0

    # The API answered through the VIP all along but for short windows, and the budgeted
    # Deployment never had fewer than its minimum of pods Ready.
    assert figures.reads > 100 and figures.pod_reads > 20
    assert figures.min_ready is not None and figures.min_ready >= 1, figures
    assert figures.longest_gap < 30, figures

    assert run(["up", inventory, "--to", "cni"]) == 0, capsys.readouterr().out[-4000:]
    print(f"\nupgrade {from_version} -> {to_version}: {took:.0f}s for 3 control planes and 2 workers; probe: "
          f"{figures.reads} reads through the VIP, {figures.failures} failed {figures.failed_reasons}, longest "
          f"window without an answer {figures.longest_gap:.1f}s; Deployment (PDB minAvailable 1) never below "
          f"{figures.min_ready} pods Ready ({figures.pod_reads} reads); first at that count: {figures.lowest[:1]}")


def test_etcd_snapshot_then_restore_brings_back_what_was_deleted(cluster, capsys):
    inventory = str(cluster["inventory"])
    assert _kubectl(cluster, "create", "namespace", "restore-probe").returncode == 0
    assert run(["etcd", "snapshot", inventory]) == 0, capsys.readouterr().out[-3000:]
    snapshot = max((cluster["kubeconfig"].parent / "etcd-snapshots").glob("*.db"), key=lambda p: p.stat().st_mtime)
    assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600
    assert _kubectl(cluster, "delete", "namespace", "restore-probe", timeout=120).returncode == 0
    assert _kubectl(cluster, "create", "namespace", "after-the-snapshot").returncode == 0

    # Refused without the confirmation, and for a snapshot others can read.
    assert run(["etcd", "restore", inventory, str(snapshot)]) == 2
    snapshot.chmod(0o644)
    assert run(["etcd", "restore", inventory, str(snapshot), "--yes-replace-the-cluster-state"]) == 2
    snapshot.chmod(0o600)
    capsys.readouterr()

    t0 = time.monotonic()
    assert run(["etcd", "restore", inventory, str(snapshot), "--yes-replace-the-cluster-state"]) == 0, \
        capsys.readouterr().out[-4000:]
    took = time.monotonic() - t0
    namespaces = json.loads(_kubectl(cluster, "get", "namespaces", "-o", "json").stdout)["items"]
    names = {n["metadata"]["name"] for n in namespaces}
    assert "restore-probe" in names and "after-the-snapshot" not in names
    # Every member came back from the snapshot, the old data kept beside it.
    members = ssh(cluster, f"{NAME}-cp2", "ls -d /var/lib/etcd.before-restore-* | wc -l; ls /var/lib/etcd/member")
    assert members.stdout.split()[0] == "1" and "snap" in members.stdout.split()
    _all_five_nodes_ready(cluster)
    print(f"\netcd restore of 3 members from {snapshot.name}: {took:.0f}s, the deleted namespace is back")


def _etcd_member_list(info) -> list[dict]:
    answer = _kubectl(info, "-n", "kube-system", "exec", f"etcd-{NAME}-cp1", "--", "etcdctl",
                      "--endpoints=https://127.0.0.1:2379", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
                      "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
                      "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key", "member", "list", "-w", "json",
                      timeout=30)
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)["members"]


def _etcd_unhealthy(info, via: str = "cp1") -> list[str]:
    """Each etcd endpoint of the cluster that does not answer healthy, in etcdctl's words
    ([] when all do). A member can be listed as started and still not serve (a crash loop
    after its join), which a member list does not show but a lost quorum would."""
    answer = _kubectl(info, "-n", "kube-system", "exec", f"etcd-{NAME}-{via}", "--", "etcdctl",
                      "--endpoints=https://127.0.0.1:2379", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
                      "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
                      "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key", "endpoint", "health", "--cluster",
                      "-w", "json", timeout=30)
    if answer.returncode != 0 and not answer.stdout.strip().startswith("["):
        return [f"etcdctl via {via}: {answer.stderr.strip()[-500:]}"]
    return [f"{e.get('endpoint')}: {e.get('error', 'unhealthy')}" for e in json.loads(answer.stdout)
            if not e.get("health")]


def _etcd_members(info) -> list[str]:
    return sorted(m.get("name", "") for m in _etcd_member_list(info))


def _touched(output: str) -> dict[str, set[str]]:
    """Per phase, the hosts a task ran on (from `--output json` events)."""
    touched: dict[str, set[str]] = {}
    phase = None
    for line in output.splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event["event"] == "PhaseStarted":
            phase = event["phase"]
        elif event["event"] == "HostResult" and phase and event["status"] != "skipped":
            touched.setdefault(phase, set()).add(event["host"])
    return touched


def test_node_remove_and_add_a_control_plane_and_a_worker(cluster, capsys):
    inventory = str(cluster["inventory"])
    cp3, w2 = f"{NAME}-cp3", f"{NAME}-w2"
    assert run(["node", "remove", inventory, cp3, "--yes-remove-it"]) == 0, capsys.readouterr().out[-4000:]
    assert _etcd_members(cluster) == [f"{NAME}-cp1", f"{NAME}-cp2"]
    names = {n["metadata"]["name"] for n in json.loads(_kubectl(cluster, "get", "nodes", "-o", "json").stdout)["items"]}
    assert cp3 not in names and len(names) == 4
    assert "missing" in ssh(cluster, cp3, "test -e /etc/kubernetes/kubelet.conf || echo missing").stdout
    assert _kubectl(cluster, "get", "--raw", "/readyz").returncode == 0  # two members keep quorum
    capsys.readouterr()

    assert run(["node", "add", inventory, cp3]) == 0, capsys.readouterr().out[-4000:]
    assert _etcd_members(cluster) == [f"{NAME}-cp1", f"{NAME}-cp2", cp3]

    # A worker out and back in: only it and the first control plane are touched (the bridge
    # CNI's routes to its pods are on every node).
    assert run(["node", "remove", inventory, w2, "--yes-remove-it"]) == 0, capsys.readouterr().out[-4000:]
    capsys.readouterr()
    assert run(["node", "add", inventory, w2, "--output", "json"]) == 0
    touched = _touched(capsys.readouterr().out)
    assert "workers_join" in touched, touched
    for phase, hosts in touched.items():
        if phase != "cni":
            assert hosts <= {f"{NAME}-cp1", w2}, (phase, hosts)
    _all_five_nodes_ready(cluster)


def test_reset_then_up_with_power_lost_mid_join_on_a_control_plane_and_a_worker_converges(cluster, capsys):
    inventory = str(cluster["inventory"])
    assert run(["reset", inventory]) == 2  # not without the confirmation
    capsys.readouterr()
    assert run(["reset", inventory, "--yes-destroy-the-cluster"]) == 0, capsys.readouterr().out[-4000:]
    assert not cluster["kubeconfig"].exists()  # the credentials of a cluster that is gone
    for host in ("cp1", "cp2", "cp3", "w1", "w2"):
        # kubeadm reset empties etcd's data directory and keeps the directory itself.
        left = ssh(cluster, f"{NAME}-{host}", "ls -d /etc/kubernetes/kubelet.conf /var/lib/etcd/* 2>/dev/null; "
                                              "systemctl is-active kubelet haproxy; dpkg-query -W -f='${Version}' kubeadm")
        lines = left.stdout.split()
        assert not [line for line in lines if line.startswith("/")], (host, left.stdout)
        assert lines[:2] == ["inactive", "inactive"] and lines[2].startswith(cluster["version"].lstrip("v")), lines
    # A plain `up` finds every result gone and builds the cluster anew; here power is lost on a
    # control plane in the middle of its join (kubelet.conf written, kubeadm still joining etcd:
    # as a learner, not yet promoted), and in a second run on a worker while kubeadm joins it.
    # Each run stops naming the node; once it is back, a plain `up`
    # converges: the half-joined control plane is reset and joined again, no etcd member is left
    # behind or doubled, every node is Ready.
    capsys.readouterr()
    cut = PowerCut(cluster, f"{NAME}-cp3", f"gpuboot-{NAME}-cp3", "[ -f /etc/kubernetes/kubelet.conf ] && pgrep -x kubeadm")
    with cut:
        code = run(["up", inventory, "--to", "cni"])
    said = capsys.readouterr().out
    assert cut.cut_after is not None, "cp3's join was never seen between kubelet.conf and its end"
    assert code != 0 and f"{NAME}-cp3" in said, said[-4000:]
    cut.power_on()
    # What etcd holds for cp3 now (a learner, a member that never started, or none): the next run's to mend.
    cp3_after_cut = [m for m in _etcd_member_list(cluster) if m.get("name", "") in ("", f"{NAME}-cp3")]
    # A worker's join lasts about two seconds, less than a watch over SSH sees on a busy machine:
    # the node's own watcher freezes kubeadm the moment it starts, and the cut lands on it frozen.
    seen = freeze_when_seen(cluster, f"{NAME}-w2", "kubeadm joi[n]", "/run/gpuboot-fault-join-seen")
    cut = PowerCut(cluster, f"{NAME}-w2", container_name(NAME, "w2"), seen)
    with cut:
        code = run(["up", inventory, "--to", "cni", "--output", "json"])
    said = capsys.readouterr().out
    assert cut.cut_after is not None, "w2's join was never seen"
    assert code != 0 and f"{NAME}-w2" in said, said[-4000:]
    events = [json.loads(line) for line in said.splitlines() if line.startswith("{")]
    started = {e["phase"]: e["reason"] for e in events if e["event"] == "PhaseStarted"}
    # The second run found the first one's control-plane join unfinished and ran it again.
    assert "control_plane_join" in started, started
    cut.power_on()
    assert run(["up", inventory, "--to", "cni"]) == 0, capsys.readouterr().out[-4000:]
    _all_five_nodes_ready(cluster)
    members = _etcd_member_list(cluster)
    assert sorted(m.get("name", "") for m in members) == [f"{NAME}-cp1", f"{NAME}-cp2", f"{NAME}-cp3"], members
    assert not any(m.get("isLearner") for m in members), members
    # Listed and started is not enough: every member serves (a quorum survives losing one node).
    _wait_until(lambda: _etcd_unhealthy(cluster), timeout=120)
    assert [line for host in ("cp1", "cp2", "cp3", "w1", "w2") for line in _cis_loose(cluster, f"{NAME}-{host}")] == []
    print(f"\npower lost on cp3 {cut.cut_after:.0f}s into the run, mid-join; its etcd member after: "
          f"{[(m.get('name', ''), bool(m.get('isLearner'))) for m in cp3_after_cut]}; then w2 mid-join; a plain up converged")


def _wait_until(problems, timeout: float) -> None:
    """Wait until `problems()` returns nothing; fail with its last answer after `timeout` s."""
    deadline = time.monotonic() + timeout
    while found := problems():
        assert time.monotonic() < deadline, found
        time.sleep(2)


def _api_servers_not_ready(info, control_planes: list[str]) -> list[str]:
    """Each control plane whose own API server does not pass /readyz, with the checks that
    fail (asked on the node itself, past haproxy, with the node's admin credentials)."""
    found = []
    for host in control_planes:
        answer = ssh(info, host, "kubectl --kubeconfig /etc/kubernetes/admin.conf --server https://127.0.0.1:6443 "
                                 "--insecure-skip-tls-verify --request-timeout=5s get --raw '/readyz?verbose' 2>&1")
        if answer.returncode != 0:
            failing = [line for line in answer.stdout.splitlines() if "[-]" in line or "error" in line.lower()]
            found.append(f"{host}: {' | '.join(failing) or answer.stdout[-300:]}")
    return found


def _failover_diagnosis(info, survivors: list[str], vip: str) -> str:
    """What a person would look at when the API does not answer through the moved VIP."""
    lines = []
    for host in survivors:
        holds = f" {vip}/" in ssh(info, host, "ip -4 -o addr show").stdout
        lines.append(f"{host}: holds the VIP: {holds}")
        lines += _api_servers_not_ready(info, [host]) or [f"{host}: /readyz ok"]
        journal = ssh(info, host, "journalctl -u haproxy -u keepalived --since '-3min' --no-pager -o cat | tail -15")
        lines.append(journal.stdout.strip())
    return "\n".join(lines)


def test_losing_the_vip_holder_moves_the_vip_and_the_api_answers_through_it(cluster):
    settings = yaml.safe_load(cluster["inventory"].read_text())["all"]["vars"]["gpuboot"]
    vip = settings["control_plane"]["vip"]
    names = [f"{NAME}-cp1", f"{NAME}-cp2", f"{NAME}-cp3"]
    # The fault is one node lost from a healthy control plane: every API server ready and every
    # etcd member serving first (this test also runs right after the day-2 tests rebuilt it).
    _wait_until(lambda: _api_servers_not_ready(cluster, names) + _etcd_unhealthy(cluster), timeout=180)
    holder = _vip_holder(cluster, names, vip)
    survivors = [h for h in names if h != holder]
    container = container_name(NAME, holder)
    subprocess.run(["podman", "stop", "-t", "2", container], check=True, capture_output=True)
    stopped = time.monotonic()
    deadline = stopped + 60
    while True:
        answer = _kubectl(cluster, "get", "nodes", "-o", "name", timeout=3)
        if answer.returncode == 0:
            break
        if time.monotonic() >= deadline:
            pytest.fail(f"the API did not answer through the VIP {vip} within 60 s of stopping {holder}: "
                        f"{answer.stderr.strip()}\n{_failover_diagnosis(cluster, survivors, vip)}")
        time.sleep(0.5)
    answered_after = time.monotonic() - stopped
    assert len(answer.stdout.split()) == 5
    assert _vip_holder(cluster, survivors, vip) in survivors
    print(f"\nVIP holder {holder} stopped, API through the VIP answered after {answered_after:.1f}s")
