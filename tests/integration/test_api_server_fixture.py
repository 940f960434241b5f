"""The real API server fixture (etcd + kube-apiserver built from Go modules, on loopback)
does what API-level tests will lean on: real admission enforces a ResourceQuota on
`requests.nvidia.com/gpu`, RBAC answers `kubectl auth can-i --as`, and server-side dry-run
rejects an invalid object. The tenant bundles (GitOps) will be checked against it."""
from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.slow]


def _pod(name: str, gpus: int) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.9.1-base-ubi9",
                        "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}})


def test_quota_on_gpus_is_enforced_by_real_admission(api):
    api.kubectl("create", "namespace", "quota-check")
    api.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": "quota-check"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}))
    api.wait_for("-n", "quota-check", "serviceaccount/default", jsonpath="{.metadata.name}")
    api.wait_for("-n", "quota-check", "resourcequota/gpus", jsonpath="{.status.hard}")
    fits = api.kubectl("create", "-n", "quota-check", "-f", "-", stdin=_pod("fits", 2))
    assert "created" in fits.stdout
    over = api.kubectl("create", "-n", "quota-check", "--dry-run=server", "-f", "-", stdin=_pod("over", 1), check=False)
    assert over.returncode != 0 and "exceeded quota" in over.stderr and "requests.nvidia.com/gpu" in over.stderr


def test_rbac_answers_can_i_for_a_group(api):
    api.kubectl("create", "namespace", "rbac-check")
    api.kubectl("create", "rolebinding", "oncall-edit", "-n", "rbac-check", "--clusterrole=edit",
                "--group=oidc:inference-oncall")
    api.wait_for("clusterrole/edit", jsonpath="{.rules[0].verbs}")  # aggregated by the controller
    yes = api.kubectl("auth", "can-i", "create", "deployments", "-n", "rbac-check",
                      as_user="alice", groups=("oidc:inference-oncall",), check=False)
    assert yes.stdout.strip() == "yes"
    elsewhere = api.kubectl("auth", "can-i", "create", "deployments", "-n", "default",
                            as_user="alice", groups=("oidc:inference-oncall",), check=False)
    assert elsewhere.stdout.strip() == "no"
    quota = api.kubectl("auth", "can-i", "update", "resourcequotas", "-n", "rbac-check",
                        as_user="alice", groups=("oidc:inference-oncall",), check=False)
    assert quota.stdout.strip() == "no"  # tenants cannot raise their own quota


def test_server_side_dry_run_rejects_an_invalid_object(api):
    bad = api.kubectl("create", "--dry-run=server", "-f", "-", check=False, stdin=json.dumps({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "Bad_Name", "namespace": "default"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}))
    assert bad.returncode != 0 and "is invalid" in bad.stderr and "Bad_Name" in bad.stderr
