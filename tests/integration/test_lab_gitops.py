"""The GitOps handoff for real (issue 15, point 4): a lab cluster made by `up` (one control plane,
one GPU worker running NVIDIA's real GPU Operator with its hardware's doubles,
tests/support/real_gpu_operator.py; the Kubernetes built from Go modules, air-gapped behind the
lab mirror), a real
Git server on the lab's gateway (Debian's sshd and git, the deploy key, the server's host key),
and real Argo CD: its one binary built from github.com/argoproj/argo-cd/v3 at the matrix's
version, kustomize from its Go module, helm from its own, in images that enter the mirror like
any other and are pulled by containerd through it. The argo-cd chart is a TEST DOUBLE (the
argo-helm chart cannot be had here) whose objects are Argo CD's own install manifests of the
same version (tests/support/argocd_chart.py).

What it shows: `up` pushes the rendered repository, installs Argo CD, and waits until every
Application is Synced and Healthy; Argo CD adopts the GPU Operator gpuboot installed on day 1
(NVIDIA's real chart, rendered by Argo CD from the mirror with the values in Git) without
changing an object, and a later `up` leaves that add-on to Argo CD; a tenant's groups may act in its namespace and nowhere else
(the real API server's RBAC, through impersonation); a pod asking for more GPUs than the quota
is refused by the real ResourceQuota admission; deleting a tenant's NetworkPolicy and raising its
quota are both undone by Argo CD's self-heal; a second `up` changes nothing; a tenant added to the
inventory afterwards is not pushed over Git (the run says so) and `gitops diff` shows it; the
deploy key is in no output, log or file gpuboot wrote."""
from __future__ import annotations

import difflib
import json
import subprocess
import time

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot_lab.cluster import LabSpec
from gpuboot_lab.gitserver import GitServer
from tests.support import gpu_operands, real_gpu_operator
from tests.support.addon_lab import addon_lab, kubectl, said
from tests.support.argocd_chart import add_to_bundle
from tests.support.reuse import reuse_module

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NAME = "gitops"
SUBNET = "10.213.86.0/24"
RELEASE = "k8s-1.36"
GIT_PORT = 2222
# One GPU worker, time-sliced: 2 L40S x 4 replicas = 8 nvidia.com/gpu for the tenants' quotas.
GPU_NODE = f"{NAME}-gpu1"
GPU_SETTINGS = {"os": "debian-12", "gpu": {"model": "L40S-48GB", "count": 2, "driver": "preinstalled",
                                          "time_slicing_replicas": 4}}
# What the preinstalled driver's double says NVML reports there.
GPUS = gpu_operands.double_gpus("NVIDIA L40S", 2, family="ada-lovelace", mig_capable=False, memory_mib=46068)
TENANTS = [
    {"name": "vision", "groups": ["oidc:vision"], "admin_groups": ["oidc:vision-leads"],
     "quota": {"gpu": 4, "cpu": "4", "memory": "8Gi", "pods": 20}, "priority_classes": ["training", "batch"]},
    {"name": "speech", "groups": ["oidc:speech"], "quota": {"gpu": 2, "cpu": "2", "memory": "4Gi"},
     "priority_classes": ["batch"]},
]


@pytest.fixture(scope="module")
def reused(request):
    """The whole module is skipped as REUSED while nothing it depends on changed since it passed
    on this machine (tests/support/reuse.py; GPUBOOT_TESTS_FRESH=1 runs it)."""
    yield from reuse_module(request)


@pytest.fixture
def gitops_cluster(reused, lab_required, tmp_path, monkeypatch, capsys):
    spec = LabSpec(name=NAME, control_planes=1, workers=0, gpu_workers=1, subnet=SUBNET, flavour="kubernetes",
                   release=RELEASE)
    with addon_lab(tmp_path, monkeypatch, capsys, spec) as node_lab:
        gateway = SUBNET.replace(".0/24", ".1")
        git = GitServer(tmp_path / "git", gateway, GIT_PORT).start()
        try:
            data = node_lab.settings()
            data["all"]["vars"]["gpuboot"]["gitops"] = {
                "repo_url": git.url, "branch": "main", "credentials_file": str(git.deploy_key),
                "known_hosts_file": str(git.known_hosts)}
            data["all"]["vars"]["gpuboot"]["tenants"] = TENANTS
            # A broken add-on must be reported within the test's patience, not the product's.
            data["all"]["vars"]["argocd_ready_timeout"] = 300
            # The DCGM exporter's probes wait 45 s; the validator's workloads run one after another.
            data["all"]["vars"]["gpu_operator_ready_timeout"] = 420
            # A lab node has no NVIDIA kernel module, so no device majors for the validator's
            # /dev/char links: NVIDIA's documented switch for such hosts.
            data["all"]["vars"]["gpuboot"]["gpu_operator"] = {"dev_char_symlinks": False}
            node_lab.write(data)
            host_vars = node_lab.inventory.parent / "host_vars"
            host_vars.mkdir()
            (host_vars / f"{GPU_NODE}.yml").write_text(yaml.safe_dump({"gpuboot_node": GPU_SETTINGS}))
            images = real_gpu_operator.into_bundle(node_lab, matrix.load(RELEASE))
            images += add_to_bundle(node_lab.bundle, RELEASE, node_lab.helm)
            node_lab.start_mirror()
            real_gpu_operator.declare_hardware(node_lab.info(), {GPU_NODE: GPUS})
            out = tmp_path / "seen"
            out.mkdir()
            info = node_lab.info(git=git, images=images, tmp=tmp_path)
            try:
                yield info
            finally:
                real_gpu_operator.keep(out, info)
        finally:
            git.stop()


def pod_routes(info) -> list[tuple[str, str]]:
    """The lab's router learns each node's pod CIDR (as a data centre's learns Calico's routes),
    so that pods reach the Git server on the gateway."""
    nodes = json.loads(kubectl(info, "get", "nodes", "-o", "json"))["items"]
    routes = []
    for node in nodes:
        address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        subprocess.run(["ip", "route", "replace", node["spec"]["podCIDR"], "via", address], check=True)
        routes.append((node["spec"]["podCIDR"], address))
    return routes


def wait_for(what: str, check, timeout: float = 180) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(2)
    raise AssertionError(f"{what}: not within {timeout} s")


def can_i(info, group: str, verb: str, resource: str, namespace: str) -> bool:
    proc = subprocess.run([str(info["kubectl"]), "--kubeconfig", str(info["kubeconfig"]), "auth", "can-i", verb, resource,
                           "-n", namespace, "--as", f"someone-in-{group}", "--as-group", group],
                          capture_output=True, text=True, timeout=30)
    return proc.stdout.strip() == "yes"


def phase_changes(info) -> dict[str, int]:
    record = json.loads((info["kubeconfig"].parent / "state.json").read_text())["phases"]
    return {name: entry["changed"] for name, entry in record.items()}


def test_up_hands_the_cluster_to_argo_cd_and_git_owns_the_tenants(gitops_cluster, capsys):
    info = gitops_cluster
    inventory, git = info["inventory"], info["git"]
    # Up to the gate, then the lab's router learns the pod routes, then the handoff.
    assert run(["up", str(inventory), "--to", "validate", "--skip-mirror-check"]) == 0, said(capsys)
    routes = pod_routes(info)
    # What gpuboot installed on day 1, before Argo CD: adoption must not change it.
    day1 = {kind: json.loads(kubectl(info, "get", kind, "-n", "gpu-operator", "-o", "json"))["items"]
            for kind in ("deployments", "configmaps")}
    day1_policy = json.loads(kubectl(info, "get", "clusterpolicies.nvidia.com", "cluster-policy", "-o", "json"))
    try:
        capsys.readouterr()
        started = time.monotonic()
        assert run(["up", str(inventory), "--skip-mirror-check"]) == 0, said(capsys)
        handoff_seconds = time.monotonic() - started
        terminal = [capsys.readouterr()]
        print(f"handoff: {handoff_seconds:.0f} s")

        # Every Application Synced and Healthy: the root, the tiers and both tenants.
        apps = {a["metadata"]["name"]: a for a in json.loads(kubectl(info, "get", "applications.argoproj.io", "-n",
                                                                     "argocd", "-o", "json"))["items"]}
        assert set(apps) == {f"{NAME}-root", "tenants-priority-classes", "tenant-vision", "tenant-speech",
                             "addon-gpu-operator"}
        for name, app in apps.items():
            assert app["status"]["sync"]["status"] == "Synced", (name, app["status"])
            assert app["status"]["health"]["status"] == "Healthy", (name, app["status"])
        # The GPU Operator's chart, rendered by Argo CD from the mirror with the values in Git, is
        # what gpuboot applied: adopted without a change (specs and data as on day 1, no rollout).
        gpu = apps["addon-gpu-operator"]
        assert {r["kind"] for r in gpu["status"]["resources"]} >= {"Deployment", "ClusterPolicy", "ConfigMap"}
        after = {kind: {o["metadata"]["name"]: o for o in json.loads(kubectl(
            info, "get", kind, "-n", "gpu-operator", "-o", "json"))["items"]} for kind in ("deployments", "configmaps")}
        for kind, objects in day1.items():
            for before in objects:
                now = after[kind][before["metadata"]["name"]]
                changed = "".join(difflib.unified_diff(
                    json.dumps({k: before.get(k) for k in ("spec", "data")}, indent=1, sort_keys=True).splitlines(True),
                    json.dumps({k: now.get(k) for k in ("spec", "data")}, indent=1, sort_keys=True).splitlines(True)))
                assert not changed, f"{kind}/{before['metadata']['name']} changed by the adoption:\n{changed}"
                # (A Deployment's generation also counts annotation changes: Argo CD's tracking
                # annotation moves it. Its revision says whether pods were rolled.)
                revision = "deployment.kubernetes.io/revision"
                # (The real operator's own ConfigMaps carry no annotations: Argo CD does not track them.)
                assert now["metadata"].get("annotations", {}).get(revision) == \
                    before["metadata"].get("annotations", {}).get(revision)
        policy = json.loads(kubectl(info, "get", "clusterpolicies.nvidia.com", "cluster-policy", "-o", "json",
                                    "--show-managed-fields"))
        assert policy["metadata"]["generation"] == day1_policy["metadata"]["generation"]
        assert {"gpuboot", "argocd-controller"} <= {m["manager"] for m in policy["metadata"]["managedFields"]}

        # The tenants' objects are Argo CD's: created by its controller, from Git.
        shown = json.loads(kubectl(info, "get", "resourcequota", "tenant-share", "-n", "vision", "-o", "json",
                                   "--show-managed-fields"))
        assert "argocd-controller" in {m["manager"] for m in shown["metadata"]["managedFields"]}
        # Argo CD's own pods run the images the matrix names, pulled through the mirror.
        pods = json.loads(kubectl(info, "get", "pods", "-n", "argocd", "-o", "json"))["items"]
        assert {c["image"] for p in pods for c in p["spec"]["containers"]} <= set(info["images"])
        assert all(c["ready"] for p in pods for c in p["status"].get("containerStatuses", [])
                   if p["status"]["phase"] == "Running")

        # RBAC from the bundle, judged by the real API server: a tenant's groups act in its
        # namespace, not in the other tenant's, and not cluster-wide.
        assert can_i(info, "oidc:vision", "create", "deployments", "vision")
        assert not can_i(info, "oidc:vision", "create", "deployments", "speech")
        assert can_i(info, "oidc:vision-leads", "create", "rolebindings", "vision")
        assert not can_i(info, "oidc:vision", "create", "rolebindings", "vision")
        assert can_i(info, "oidc:speech", "get", "pods", "speech")
        assert not can_i(info, "oidc:speech", "get", "pods", "vision")
        assert not can_i(info, "oidc:vision", "delete", "nodes", "default")

        # More GPUs than the quota (4): refused at admission by the real ResourceQuota.
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "greedy", "namespace": "vision"},
               "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                        "resources": {"limits": {"nvidia.com/gpu": "5"}},
                                        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                                            "capabilities": {"drop": ["ALL"]},
                                                            "seccompProfile": {"type": "RuntimeDefault"}}}]}}
        refused = subprocess.run([str(info["kubectl"]), "--kubeconfig", str(info["kubeconfig"]), "create", "-f", "-"],
                                 input=json.dumps(pod), capture_output=True, text=True, timeout=30)
        assert refused.returncode != 0 and "exceeded quota: tenant-share" in refused.stderr, refused.stderr
        assert "requests.nvidia.com/gpu" in refused.stderr

        # Self-heal: a deleted NetworkPolicy and a raised quota are put back from Git.
        kubectl(info, "delete", "networkpolicy", "default-deny", "-n", "speech")
        healed = wait_for("default-deny back in speech", lambda: subprocess.run(
            [str(info["kubectl"]), "--kubeconfig", str(info["kubeconfig"]), "get", "networkpolicy", "default-deny",
             "-n", "speech"], capture_output=True).returncode == 0)
        kubectl(info, "patch", "resourcequota", "tenant-share", "-n", "vision", "--type", "merge",
                "-p", json.dumps({"spec": {"hard": {"requests.cpu": "400"}}}))
        reverted = wait_for("vision's quota back to 4 CPUs", lambda: json.loads(kubectl(
            info, "get", "resourcequota", "tenant-share", "-n", "vision", "-o", "json"))["spec"]["hard"]["requests.cpu"] == "4")
        print(f"self-heal: NetworkPolicy back in {healed:.0f} s, quota in {reverted:.0f} s")

        # A second up of the GPU Operator and the handoff changes nothing: the add-on is Argo CD's
        # now, so its phase says so and leaves it alone.
        assert run(["up", str(inventory), "--from", "gpu_operator", "--force", "--skip-mirror-check"]) == 0, said(capsys)
        out = capsys.readouterr()
        terminal.append(out)
        assert "gpu-operator is owned by Argo CD (application.argoproj.io/addon-gpu-operator)" in out.out
        assert phase_changes(info)["gitops_handoff"] == 0 and phase_changes(info)["gpu_operator"] == 0

        # A dry run of every phase on the converged, handed-off cluster: `plan --check` runs each
        # playbook in check mode with diff, reads what it needs (the mirror's charts included;
        # tests/unit/test_check_mode.py) and finds nothing to change.
        assert run(["plan", str(inventory), "--check", "--output", "json"]) == 0, said(capsys)
        out = capsys.readouterr()
        terminal.append(out)
        events = [json.loads(line) for line in out.out.splitlines() if line.startswith('{"event"')]
        started = [e["phase"] for e in events if e["event"] == "PhaseStarted"]
        finished = {e["phase"]: e for e in events if e["event"] == "PhaseFinished"}
        assert {"control_plane_init", "workers_join", "gpu_operator", "validate", "gitops_handoff"} <= set(started)
        assert set(finished) == set(started), (started, sorted(finished))
        assert all(e["status"] == "ok" and e["changed"] == 0 for e in finished.values()), finished
        assert next(e for e in events if e["event"] == "RunFinished")["status"] == "ok"

        # A tenant added to the inventory after the handoff: Git owns the directory, so up does
        # not push it, says so, and `gitops diff` shows the files to commit.
        data = yaml.safe_load(inventory.read_text())
        data["all"]["vars"]["gpuboot"]["tenants"].append({"name": "robotics", "groups": ["oidc:robotics"],
                                                          "priority_classes": ["batch"]})
        inventory.write_text(yaml.safe_dump(data, sort_keys=False))
        assert run(["up", str(inventory), "--from", "gitops_handoff", "--skip-mirror-check"]) == 0, said(capsys)
        out = capsys.readouterr()
        terminal.append(out)
        assert "notice" in out.out and "did not push" in out.out and "gitops diff" in out.out
        assert run(["gitops", "diff", str(inventory), "--exit-code"]) == 1
        out = capsys.readouterr()
        terminal.append(out)
        assert f"b/clusters/{NAME}/tenants/robotics/quota.yaml" in out.out
        assert f"b/clusters/{NAME}/argocd/applications/tenant-robotics.yaml" in out.out
        assert "robotics" not in kubectl(info, "get", "namespaces")

        # The deploy key: in no terminal output, run log, artifact, state file or Git.
        secret_lines = [line for line in git.deploy_key.read_text().splitlines() if line and "PRIVATE KEY" not in line]
        texts = [t.out + t.err for t in terminal]
        state_dir = info["kubeconfig"].parent
        texts += [p.read_text(errors="replace") for p in state_dir.rglob("*") if p.is_file()]
        clone = info["tmp"] / "clone"
        assert git.git("clone", "--quiet", git.url, str(clone)).returncode == 0
        texts += [p.read_text(errors="replace") for p in clone.rglob("*") if p.is_file() and ".git" not in p.parts]
        assert texts and not any(line in text for text in texts for line in secret_lines)
    finally:
        for cidr, via in routes:
            subprocess.run(["ip", "route", "del", cidr, "via", via], check=False)
