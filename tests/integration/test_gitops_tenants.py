"""The GitOps repository against real Kubernetes: every kustomization builds with kubectl's own
kustomize and no network, and the four-tenant fleet's bundles, applied to a real API server
(etcd + kube-apiserver built from Go modules), are enforced by its admission and RBAC:
a tenant's groups act in their namespace and nowhere else, never on their own quota; GPU and
MIG requests above the quota, a priority tier the tenant was not given, and pods the
namespace's pod security forbids are all refused; a container that asks for nothing gets
the tenant's default requests."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from gpuboot.cli.main import run

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FOUR_TENANTS = ROOT / "tests" / "fixtures" / "four-tenants" / "hosts.ini"
SAMPLE = ROOT / "inventories" / "sample" / "inventory.yml"
# Meets the restricted pod security standard, so only what a test changes is judged.
RESTRICTED = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def render(inventory: Path, out: Path) -> Path:
    assert run(["gitops", "render", str(inventory), "--out", str(out)]) == 0
    return out / "clusters" / ("shared" if inventory == FOUR_TENANTS else "h200-prod")


@pytest.fixture(scope="module")
def four_tenants(tmp_path_factory, api):
    repo = render(FOUR_TENANTS, tmp_path_factory.mktemp("gitops"))
    api.kubectl("apply", "--server-side", "--field-manager", "argocd-controller", "-k",
                str(repo / "tenants" / "priority-classes"))
    api.kubectl("apply", "--server-side", "--field-manager", "argocd-controller", "-k",
                str(repo / "tenants" / "node-groups"))
    for tenant in ("llm-training", "inference", "notebooks", "batch-jobs"):
        api.kubectl("apply", "--server-side", "--field-manager", "argocd-controller", "-k", str(repo / "tenants" / tenant))
        api.wait_for("-n", tenant, "serviceaccount/default", jsonpath="{.metadata.name}")
        api.wait_for("-n", tenant, "resourcequota/tenant-share", jsonpath="{.status.hard}")
    api.wait_for("clusterrole/edit", jsonpath="{.rules[0].verbs}")  # aggregated by the controller
    return repo


def _objects(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _key(obj: dict) -> tuple:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def test_every_kustomization_builds_offline(api, tmp_path: Path):
    # A proxy that answers nothing: a build that reached for the network would fail.
    offline = {**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
               "NO_PROXY": ""}
    built = 0
    for inventory in (SAMPLE, FOUR_TENANTS):
        repo = render(inventory, tmp_path / inventory.parent.name)
        for kustomization in sorted(repo.rglob("kustomization.yaml")):
            directory = kustomization.parent
            proc = subprocess.run([str(api.bin_dir / "kubectl"), "kustomize", str(directory)], env=offline,
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, f"{directory}: {proc.stderr}"
            got = {_key(o): o for o in _objects(proc.stdout)}
            # The build is exactly the files it lists, nothing added or changed on the way.
            want = {}
            for resource in yaml.safe_load(kustomization.read_text())["resources"]:
                target = directory / resource
                files = [target] if target.is_file() else [
                    target / r for r in yaml.safe_load((target / "kustomization.yaml").read_text())["resources"]]
                for path in files:
                    want.update({_key(o): o for o in _objects(path.read_text())})
            assert got == want, directory
            built += 1
    assert built >= 20


def _pod(name: str, *, gpus: int = 0, mig: str | None = None, priority: str | None = None,
         restricted: bool = False, privileged: bool = False, requests: bool = True) -> str:
    container: dict = {"name": "main", "image": "nvcr.io/nvidia/cuda:12.9.1-base-ubi9"}
    limits = {}
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    if mig:
        limits[f"nvidia.com/mig-{mig}"] = 1
    if limits:
        container["resources"] = {"limits": limits}
    if requests:
        container.setdefault("resources", {})["requests"] = {"cpu": "1", "memory": "1Gi"}
    spec: dict = {"containers": [container]}
    if restricted:
        spec["securityContext"] = RESTRICTED
        container["securityContext"] = CONTAINER_RESTRICTED
    if privileged:
        container["securityContext"] = {"privileged": True}
    if priority:
        spec["priorityClassName"] = f"gpuboot-{priority}"
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


# Tenants bound to a node group (the fixture's node_group): their pods select its nodes.
NODE_GROUPS = {"notebooks": "h100_mig"}


def _try(api, namespace: str, pod: str, select: bool = True) -> subprocess.CompletedProcess:
    """A server-side dry run of the pod; in a namespace bound to a node group the pod selects
    that group's nodes, unless `select` is False."""
    if select and namespace in NODE_GROUPS:
        body = json.loads(pod)
        body["spec"]["nodeSelector"] = {f"node-group.gpuboot.io/{NODE_GROUPS[namespace]}": "true"}
        pod = json.dumps(body)
    return api.kubectl("create", "-n", namespace, "--dry-run=server", "-o", "json", "-f", "-", stdin=pod, check=False)


def test_a_tenant_bound_to_a_node_group_runs_only_pods_that_select_it(api, four_tenants):
    """notebooks is bound to the MIG nodes: a pod that does not select them (or selects another
    group's) is refused by the API server, saying what to set; one that does is admitted. A
    tenant without a node group is not judged."""
    refused = _try(api, "notebooks", _pod("anywhere", mig="1g.10gb", priority="interactive"), select=False)
    assert refused.returncode != 0
    assert ('the pods of this tenant run on node group h100_mig: set spec.nodeSelector '
            '{"node-group.gpuboot.io/h100_mig": "true"}') in refused.stderr
    other = json.loads(_pod("elsewhere", mig="1g.10gb", priority="interactive"))
    other["spec"]["nodeSelector"] = {"node-group.gpuboot.io/l40s_sliced": "true"}
    assert _try(api, "notebooks", json.dumps(other), select=False).returncode != 0
    assert _try(api, "notebooks", _pod("there", mig="1g.10gb", priority="interactive")).returncode == 0
    assert _try(api, "llm-training", _pod("free", gpus=1, priority="training")).returncode == 0
    namespace = json.loads(api.kubectl("get", "namespace", "notebooks", "-o", "json").stdout)
    assert namespace["metadata"]["labels"]["gpuboot.io/node-group"] == "h100_mig"


def _can(api, verb: str, resource: str, namespace: str, group: str) -> bool:
    proc = api.kubectl("auth", "can-i", verb, resource, "-n", namespace, as_user="someone", groups=(group,), check=False)
    return proc.stdout.strip() == "yes"


def test_groups_act_in_their_namespace_only(api, four_tenants):
    assert _can(api, "create", "deployments", "llm-training", "oidc:llm-researchers")
    assert not _can(api, "create", "deployments", "inference", "oidc:llm-researchers")
    assert not _can(api, "update", "resourcequotas", "llm-training", "oidc:llm-researchers")
    assert not _can(api, "delete", "limitranges", "llm-training", "oidc:llm-leads")
    assert not _can(api, "create", "rolebindings", "llm-training", "oidc:llm-researchers")  # edit
    assert _can(api, "create", "rolebindings", "llm-training", "oidc:llm-leads")            # admin
    assert _can(api, "get", "pods", "inference", "oidc:sre")                                # view
    assert not _can(api, "create", "pods", "inference", "oidc:sre")
    assert not _can(api, "create", "priorityclasses", "", "oidc:llm-leads")
    assert _can(api, "create", "jobs", "batch-jobs", "system:serviceaccounts:ci")


def test_gpu_and_mig_quotas_are_enforced(api, four_tenants):
    assert _try(api, "inference", _pod("fits", gpus=32, priority="serving", restricted=True)).returncode == 0
    over = _try(api, "inference", _pod("over", gpus=33, priority="serving", restricted=True))
    assert over.returncode != 0 and "exceeded quota" in over.stderr and "requests.nvidia.com/gpu" in over.stderr
    # notebooks has MIG devices and no whole GPU; llm-training whole GPUs and no MIG device.
    assert _try(api, "notebooks", _pod("slice", mig="1g.10gb", priority="interactive")).returncode == 0
    whole = _try(api, "notebooks", _pod("whole", gpus=1, priority="interactive"))
    assert whole.returncode != 0 and "requests.nvidia.com/gpu" in whole.stderr
    mig = _try(api, "llm-training", _pod("slice", mig="1g.10gb", priority="training"))
    assert mig.returncode != 0 and "requests.nvidia.com/mig-1g.10gb" in mig.stderr


def test_a_tenant_uses_only_its_priority_tiers(api, four_tenants):
    assert _try(api, "llm-training", _pod("train", gpus=1, priority="training")).returncode == 0
    assert _try(api, "llm-training", _pod("plain", gpus=1)).returncode == 0  # no class: priority 0
    serving = _try(api, "llm-training", _pod("jump", gpus=1, priority="serving"))
    assert serving.returncode != 0 and "tenant-priority-tiers" in serving.stderr
    system = api.kubectl("create", "-n", "llm-training", "--dry-run=server", "-f", "-", check=False,
                         stdin=json.dumps({**json.loads(_pod("sys")), "spec": {
                             **json.loads(_pod("sys"))["spec"], "priorityClassName": "system-cluster-critical"}}))
    assert system.returncode != 0


def test_defaults_and_pod_security(api, four_tenants):
    bare = _try(api, "notebooks", _pod("bare", requests=False, priority="interactive"))
    assert bare.returncode == 0, bare.stderr
    requests = json.loads(bare.stdout)["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": "250m", "memory": "1Gi"}
    root = _try(api, "inference", _pod("root", priority="serving"))
    assert root.returncode != 0 and "violates PodSecurity" in root.stderr and "restricted" in root.stderr
    privileged = _try(api, "llm-training", _pod("priv", privileged=True, priority="batch"))
    assert privileged.returncode != 0 and "violates PodSecurity" in privileged.stderr
    assert _try(api, "batch-jobs", _pod("priv", privileged=True, priority="batch")).returncode == 0


def test_network_policies_deny_by_default(api, four_tenants):
    policies = json.loads(api.kubectl("get", "networkpolicies", "-n", "notebooks", "-o", "json").stdout)["items"]
    by_name = {p["metadata"]["name"]: p["spec"] for p in policies}
    assert set(by_name) == {"default-deny", "allow-same-namespace", "allow-dns"}
    assert by_name["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def _established(api, crd: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = api.kubectl("get", f"crd/{crd}", "-o", 'jsonpath={.status.conditions[?(@.type=="Established")].status}',
                             check=False).stdout
        if status == "True":
            return
        time.sleep(0.5)
    raise AssertionError(f"CRD {crd} not established after {timeout}s")


def test_argocd_objects_pass_argocds_own_schema(api, tmp_path: Path):
    """The Applications and AppProjects, server-side dry-run against Argo CD's real CRDs (from
    its Go module at the matrix's version): a field Argo CD does not know is refused."""
    from gpuboot import matrix
    from gpuboot_lab.argocd import crds
    version = matrix.load("k8s-1.36").model_extra["argocd"]["version"]
    for crd in crds(version):
        api.kubectl("apply", "--server-side", "-f", str(crd))
    for crd in ("applications.argoproj.io", "appprojects.argoproj.io"):
        _established(api, crd)
    api.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "argocd"}}))
    checked = 0
    for inventory in (SAMPLE, FOUR_TENANTS):
        repo = render(inventory, tmp_path / inventory.parent.name)
        built = api.kubectl("kustomize", str(repo / "argocd")).stdout
        strict = api.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", "-",
                             stdin=built, check=False)
        assert strict.returncode == 0, strict.stderr
        checked += len(_objects(built))
    assert checked >= 15
    # The check can fail: a misspelt field is refused.
    bad = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "x", "namespace": "argocd"},
           "spec": {"project": "platform", "destination": {"server": "https://kubernetes.default.svc"},
                    "source": {"repoURL": "https://example.invalid/x.git", "path": "."},
                    "syncPolicy": {"automated": {"selfheal": True}}}}
    refused = api.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", "-",
                          stdin=json.dumps(bad), check=False)
    assert refused.returncode != 0 and "selfheal" in refused.stderr


KAI_QUEUE_CRD = ROOT / "tests" / "doubles" / "kai_scheduler" / "queues-crd.yaml"
TENANTS = ("llm-training", "inference", "notebooks", "batch-jobs")


def _labelled(obj: str, queue: str) -> str:
    body = json.loads(obj)
    body["metadata"]["labels"] = {"kai.scheduler/queue": queue}
    return json.dumps(body)


def test_kai_queues_follow_the_quotas_and_a_tenant_names_only_its_own_queue(api, four_tenants, queue_rule_removed):
    """The queues pass a strict server-side apply against a double of KAI's Queue CRD (KAI's chart
    cannot be had here), and the admission rule is the real API server's own: in a tenant's
    namespace, a pod or any other object naming another tenant's queue is refused."""
    api.kubectl("apply", "--server-side", "-f", str(KAI_QUEUE_CRD))
    _established(api, "queues.scheduling.run.ai")
    built = api.kubectl("kustomize", str(four_tenants / "tenants" / "queues")).stdout
    applied = api.kubectl("apply", "--server-side", "--validate=strict", "--field-manager", "argocd-controller",
                          "-f", "-", stdin=built, check=False)
    assert applied.returncode == 0, applied.stderr
    queues = {q["metadata"]["name"]: q["spec"] for q in json.loads(
        api.kubectl("get", "queues.scheduling.run.ai", "-o", "json").stdout)["items"]}
    assert set(queues) == {"gpuboot-tenants", *TENANTS}
    assert all(queues[t]["parentQueue"] == "gpuboot-tenants" for t in TENANTS)
    # From the quotas: GPUs as counted, CPU in millicores, memory in megabytes (10^6 bytes).
    assert queues["llm-training"]["resources"] == {
        "gpu": {"quota": 24, "limit": 24, "overQuotaWeight": 3},
        "cpu": {"quota": 512000, "limit": 512000, "overQuotaWeight": 3},
        "memory": {"quota": 4398046, "limit": 4398046, "overQuotaWeight": 3}}
    # notebooks has MIG devices only: KAI counts them as GPU fractions, so no GPU limit on its queue.
    assert queues["notebooks"]["resources"]["gpu"] == {"quota": 0, "limit": -1, "overQuotaWeight": 1}
    # batch-jobs sets no CPU or memory quota: no guaranteed share, no limit; and takes nothing over quota.
    assert queues["batch-jobs"]["resources"]["cpu"] == {"quota": 0, "limit": -1, "overQuotaWeight": 0}
    assert queues["gpuboot-tenants"]["resources"]["gpu"] == {"quota": 24 + 32 + 0 + 8, "limit": -1,
                                                             "overQuotaWeight": 1}
    # The schema check can fail: a field KAI does not have is refused.
    bad = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "x"},
           "spec": {"resources": {"gpu": {"quota": 1, "overquotaWeight": 1}}}}
    refused = api.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", "-",
                          stdin=json.dumps(bad), check=False)
    assert refused.returncode != 0 and "overquotaWeight" in refused.stderr

    # A ValidatingAdmissionPolicy takes effect once the API server has loaded it: wait for the first refusal.
    deadline = time.monotonic() + 60
    while True:
        other = _try(api, "llm-training", _labelled(_pod("borrow", gpus=1, priority="training"), "inference"))
        if other.returncode != 0:
            break
        assert time.monotonic() < deadline, "a pod naming another tenant's queue was still admitted after 60 s"
        time.sleep(1)
    assert "kai.scheduler/queue may only name the queue of tenant llm-training" in other.stderr, other.stderr
    own = _try(api, "llm-training", _labelled(_pod("mine", gpus=1, priority="training"), "llm-training"))
    assert own.returncode == 0, own.stderr
    assert _try(api, "llm-training", _pod("unlabelled", gpus=1, priority="training")).returncode == 0
    # KAI reads the queue from a workload's top owner: the rule holds for every kind, not pods alone.
    job = json.dumps({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
                      "spec": {"template": {"spec": {**json.loads(_pod("t", gpus=1, priority="training"))["spec"],
                                                     "restartPolicy": "Never"}}}})
    foreign = api.kubectl("create", "-n", "llm-training", "--dry-run=server", "-f", "-",
                          stdin=_labelled(job, "inference"), check=False)
    assert foreign.returncode != 0 and "may only name the queue of tenant llm-training" in foreign.stderr
    assert api.kubectl("create", "-n", "llm-training", "--dry-run=server", "-f", "-",
                       stdin=_labelled(job, "llm-training"), check=False).returncode == 0
    # Cluster-scoped writes are none of the rule's business (a request for one has no namespace).
    tier = json.dumps({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                       "metadata": {"name": "x", "labels": {"kai.scheduler/queue": "inference"}}, "value": 1})
    cluster_scoped = api.kubectl("create", "--dry-run=server", "-f", "-", stdin=tier, check=False)
    assert cluster_scoped.returncode == 0, cluster_scoped.stderr


@pytest.fixture
def queue_rule_removed(api):
    """The admission rule is cluster-wide: it goes when the test that applied it ends, so the
    session's other tests meet the API server as they expect it."""
    yield
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        api.kubectl("delete", kind, "gpuboot-tenant-queue", "--ignore-not-found", check=False)
