"""A tenant's bundle: the objects that make a namespace a tenant's and keep it within its
share. Pure data from the validated settings; the repository writer lays them out.

Each guardrail is enforced by the API server itself (admission), not by a controller that
could be down: ResourceQuota for the tenant's share and its priority tiers, LimitRange so a
container that asks for nothing still counts, Pod Security Admission on the namespace, RBAC
that never lets a tenant's groups change their own quota or limits."""
from __future__ import annotations

from gpuboot.config.model import NODE_GROUP_LABEL_PREFIX, PRIORITY_TIERS, Tenant

TENANT_LABEL = "gpuboot.io/tenant"
# On a tenant's namespace: the node group its pods must select (Tenant.node_group).
NODE_GROUP_LABEL = "gpuboot.io/node-group"
NODE_GROUP_POLICY = "gpuboot-tenant-node-group"
GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
# Highest first, P0 to P3; all below the system-* classes (2e9) the cluster's own pods use.
TIER_VALUES = {"serving": 100000, "training": 10000, "interactive": 1000, "batch": 100}
TIER_WORDS = {
    "serving": "P0 serving: online inference; preempts every lower tier",
    "training": "P1 training: long GPU jobs; preempts interactive and batch",
    "interactive": "P2 interactive: notebooks and debugging; preempts batch",
    "batch": "P3 batch: fills what is left and never preempts",
}
# Which ClusterRole each list of a tenant's groups is bound to in its namespace.
GROUP_ROLES = (("admin_groups", "admin"), ("groups", "edit"), ("view_groups", "view"))


def priority_class_name(tier: str) -> str:
    return f"gpuboot-{tier}"


def priority_classes(tenants: list[Tenant]) -> list[dict]:
    """The tiers some tenant names, as PriorityClasses (cluster-scoped, shared)."""
    named = {tier for tenant in tenants for tier in tenant.priority_classes}
    return [{
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": priority_class_name(tier), "labels": {"app.kubernetes.io/managed-by": "gpuboot"}},
        "value": TIER_VALUES[tier],
        "globalDefault": False,
        "preemptionPolicy": "Never" if tier == "batch" else "PreemptLowerPriority",
        "description": TIER_WORDS[tier],
    } for tier in PRIORITY_TIERS if tier in named]


def _meta(tenant: Tenant, name: str) -> dict:
    return {"name": name, "namespace": tenant.name, "labels": {TENANT_LABEL: tenant.name}}


def namespace(tenant: Tenant, kubernetes_minor: str) -> dict:
    # Pinned to the cluster's minor so an upgrade does not tighten the rules under running
    # workloads; restricted is always warned and audited, so what would break is visible.
    level = tenant.pod_security
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": tenant.name, "labels": {
        TENANT_LABEL: tenant.name,
        "pod-security.kubernetes.io/enforce": level,
        "pod-security.kubernetes.io/enforce-version": kubernetes_minor,
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/warn-version": kubernetes_minor,
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/audit-version": kubernetes_minor,
        **({NODE_GROUP_LABEL: tenant.node_group} if tenant.node_group else {}),
    }}}


def admission_policy(name: str, spec: dict) -> list[dict]:
    """A ValidatingAdmissionPolicy of gpuboot's and the binding that makes it deny."""
    def meta() -> dict:
        return {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpuboot"}}
    return [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
             "metadata": meta(), "spec": spec},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": meta(), "spec": {"policyName": name, "validationActions": ["Deny"]}}]


def node_group_admission() -> list[dict]:
    """A pod in the namespace of a tenant bound to a node group must select that group's nodes
    (nodeSelector node-group.gpuboot.io/<group>: "true", the label gpuboot puts on them): the API
    server refuses any other, so no pod of the tenant lands on another group's GPUs."""
    group = f"namespaceObject.metadata.labels['{NODE_GROUP_LABEL}']"
    key = f"'{NODE_GROUP_LABEL_PREFIX}' + {group}"
    return admission_policy(NODE_GROUP_POLICY, {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "namespaceSelector": {"matchExpressions": [{"key": NODE_GROUP_LABEL, "operator": "Exists"}]},
            "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                               "resources": ["pods"]}]},
        "validations": [{
            "expression": (f"has(object.spec.nodeSelector) && ({key}) in object.spec.nodeSelector && "
                           f"object.spec.nodeSelector[{key}] == 'true'"),
            "messageExpression": (f"'the pods of this tenant run on node group ' + {group} + "
                                  f"': set spec.nodeSelector {{\"' + {key} + '\": \"true\"}}'"),
            "reason": "Forbidden"}]})


def role_bindings(tenant: Tenant) -> list[dict]:
    bindings = []
    for field, role in GROUP_ROLES:
        groups = getattr(tenant, field)
        if groups:
            bindings.append({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": _meta(tenant, f"tenant-{role}"),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
                             for group in groups],
            })
    return bindings


def quota_hard(tenant: Tenant, mig_profiles: list[str]) -> dict[str, str]:
    """The tenant's share. Every MIG profile the cluster offers is limited (to 0 when the tenant
    names none), so a tenant without MIG quota cannot take MIG devices either. Extended
    resources only have a `requests.` quota."""
    quota = tenant.quota
    hard = {f"requests.{GPU}": str(quota.gpu)}
    for profile in sorted(set(mig_profiles) | set(quota.mig)):
        hard[f"requests.{MIG_PREFIX}{profile}"] = str(quota.mig.get(profile, 0))
    if quota.cpu is not None:
        hard["requests.cpu"] = quota.cpu
    if quota.memory is not None:
        hard["requests.memory"] = quota.memory
    if quota.pods is not None:
        hard["pods"] = str(quota.pods)
    return hard


def quotas(tenant: Tenant, mig_profiles: list[str], time_sliced: bool) -> list[dict]:
    share = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": _meta(tenant, "tenant-share"),
             "spec": {"hard": quota_hard(tenant, mig_profiles)}}
    if time_sliced:
        share["metadata"]["annotations"] = {
            "gpuboot.io/gpu-quota": "nvidia.com/gpu counts what the device plugin advertises: on time-sliced "
                                    "nodes each physical GPU is several replicas, and the quota counts replicas"}
    # A pod naming a priority class outside the tenant's tiers is refused (0 pods allowed);
    # a pod naming none runs at priority 0, below every tier.
    tiers = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": _meta(tenant, "tenant-priority-tiers"),
             "spec": {"hard": {"pods": "0"}, "scopeSelector": {"matchExpressions": [
                 {"scopeName": "PriorityClass", "operator": "Exists"},
                 {"scopeName": "PriorityClass", "operator": "NotIn",
                  "values": [priority_class_name(tier) for tier in tenant.priority_classes]},
             ]}}}
    return [share, tiers]


def limit_range(tenant: Tenant) -> dict:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": _meta(tenant, "tenant-defaults"),
            "spec": {"limits": [{"type": "Container", "defaultRequest": {
                "cpu": tenant.defaults.cpu, "memory": tenant.defaults.memory}}]}}


def network_policy(tenant: Tenant, name: str, spec: dict) -> dict:
    """A NetworkPolicy of the tenant's namespace; unless `spec` selects pods, it is for all of them."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(tenant, name),
            "spec": {"podSelector": {}, **spec}}


def network_policies(tenant: Tenant) -> list[dict]:
    """Deny by default; allow the namespace to itself and DNS to the cluster's resolver."""
    def policy(name: str, spec: dict) -> dict:
        return network_policy(tenant, name, spec)
    dns_ports = [{"protocol": protocol, "port": 53} for protocol in ("UDP", "TCP")]
    return [
        policy("default-deny", {"policyTypes": ["Ingress", "Egress"]}),
        policy("allow-same-namespace", {"policyTypes": ["Ingress", "Egress"],
                                        "ingress": [{"from": [{"podSelector": {}}]}],
                                        "egress": [{"to": [{"podSelector": {}}]}]}),
        policy("allow-dns", {"policyTypes": ["Egress"], "egress": [{"to": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}], "ports": dns_ports}]}),
    ]


def bundle(tenant: Tenant, *, kubernetes_minor: str, mig_profiles: list[str], time_sliced: bool) -> dict[str, list[dict]]:
    """The tenant's objects by file name."""
    files = {
        "namespace.yaml": [namespace(tenant, kubernetes_minor)],
        "quota.yaml": quotas(tenant, mig_profiles, time_sliced),
        "limit-range.yaml": [limit_range(tenant)],
        "network-policies.yaml": network_policies(tenant),
    }
    bindings = role_bindings(tenant)
    if bindings:
        files["rbac.yaml"] = bindings
    return files
