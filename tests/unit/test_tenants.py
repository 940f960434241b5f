"""A tenant's bundle from its settings (bootstrap/gpuboot/gitops/tenants.py). The API server's
enforcement of these objects is tested in tests/integration/test_gitops_tenants.py."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuboot.config.model import PRIORITY_TIERS, Tenant
from gpuboot.gitops import tenants as tenancy


def _bundle(tenant: Tenant, profiles=("1g.10gb", "3g.40gb"), sliced=False) -> dict[str, list[dict]]:
    return tenancy.bundle(tenant, kubernetes_minor="v1.35", mig_profiles=list(profiles), time_sliced=sliced)


def test_quota_limits_every_offered_mig_profile_and_only_requests():
    tenant = Tenant(name="notebooks", quota={"mig": {"1g.10gb": 14}, "memory": "512Gi"})
    share, tiers = _bundle(tenant)["quota.yaml"]
    assert share["spec"]["hard"] == {"requests.nvidia.com/gpu": "0", "requests.nvidia.com/mig-1g.10gb": "14",
                                     "requests.nvidia.com/mig-3g.40gb": "0", "requests.memory": "512Gi"}
    assert "annotations" not in share["metadata"]
    assert tiers["spec"]["hard"] == {"pods": "0"}
    assert tiers["spec"]["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "Exists"},
        {"scopeName": "PriorityClass", "operator": "NotIn", "values": ["gpuboot-batch"]}]


def test_time_slicing_is_stated_on_the_quota():
    share, _ = _bundle(Tenant(name="a", quota={"gpu": 8}), sliced=True)["quota.yaml"]
    assert "replicas" in share["metadata"]["annotations"]["gpuboot.io/gpu-quota"]


def test_groups_are_bound_to_the_role_their_list_names():
    tenant = Tenant(name="a", groups=["dev"], view_groups=["sre", "audit"])
    bindings = {b["roleRef"]["name"]: [s["name"] for s in b["subjects"]] for b in _bundle(tenant)["rbac.yaml"]}
    assert bindings == {"edit": ["dev"], "view": ["sre", "audit"]}
    assert "rbac.yaml" not in _bundle(Tenant(name="b"))


def test_priority_tiers_are_ordered_and_only_named_ones_exist():
    tenants = [Tenant(name="a", priority_classes=["batch", "serving"]), Tenant(name="b", priority_classes=["training"])]
    classes = tenancy.priority_classes(tenants)
    assert [c["metadata"]["name"] for c in classes] == ["gpuboot-serving", "gpuboot-training", "gpuboot-batch"]
    values = [tenancy.TIER_VALUES[t] for t in PRIORITY_TIERS]
    assert values == sorted(values, reverse=True) and max(values) < 1_000_000_000  # below system-*
    assert {c["metadata"]["name"]: c["preemptionPolicy"] for c in classes}["gpuboot-batch"] == "Never"


def test_namespace_enforces_its_level_and_always_warns_restricted():
    labels = _bundle(Tenant(name="a", pod_security="privileged"))["namespace.yaml"][0]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/enforce-version"] == "v1.35"


@pytest.mark.parametrize("bad, says", [
    ({"priority_class": "x"}, "priority_classes"),
    ({"priority_classes": []}, "no tier named"),
    ({"priority_classes": ["batch", "batch"]}, "named twice"),
    ({"priority_classes": ["urgent"]}, "serving"),
    ({"quota": {"mig": {"1g.10gb": 0}}}, "greater than or equal to 1"),
])
def test_bad_tenant_settings_are_refused(bad, says):
    with pytest.raises(ValidationError) as info:
        Tenant(name="a", **bad)
    assert says in str(info.value)
