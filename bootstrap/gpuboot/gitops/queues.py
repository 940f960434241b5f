"""KAI scheduler queues derived from the tenants' quotas, and the admission rule that keeps a
tenant in its own queue. Pure data from the validated settings; the repository writer lays
them out.

KAI counts a queue's resources in units of its own: GPUs, CPU in millicores, memory in
megabytes (10^6 bytes); -1 means unlimited. Each tenant gets one queue, named after it,
under the cluster's parent queue:
- gpu: quota and limit are the tenant's `requests.nvidia.com/gpu` quota. The quota-fit check
  already makes sure the GPU workers hold every tenant's quota at once, so KAI can give each
  tenant its whole share; the ResourceQuota would refuse more anyway. With time-slicing both
  count replicas, as the device plugin advertises them.
- cpu, memory: quota and limit are the tenant's requests quota, rounded down to KAI's unit;
  a tenant without one has no guaranteed share (quota 0) and no limit (-1).
- overQuotaWeight: the tenant's over_quota_weight, for what is left over the quotas.
MIG devices have no queue resource of their own: KAI counts a MIG device as a fraction of a GPU.
A tenant with a MIG quota therefore gets no GPU limit on its queue (-1; its deserved share
stays its whole-GPU quota), or its MIG pods could never fit a limit of its whole GPUs; the
ResourceQuota bounds its MIG devices per profile.

A pod picks its queue with the label kai.scheduler/queue (KAI reads it from the workload's
top owner). Nothing in KAI ties a queue to a namespace, so a ValidatingAdmissionPolicy does:
in a tenant's namespace that label, on any object, must name the tenant's own queue."""
from __future__ import annotations

import math
import re
from decimal import Decimal

from gpuboot.config.model import QUANTITY, KaiScheduler, Tenant
from gpuboot.gitops.tenants import TENANT_LABEL, admission_policy

QUEUE_API = "scheduling.run.ai/v2"
QUEUE_LABEL = "kai.scheduler/queue"
UNLIMITED = -1
POLICY_NAME = "gpuboot-tenant-queue"
# The settings model's quantity form is the one pattern; this table gives each of its suffixes a value.
_SUFFIX = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(QUANTITY)


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity (the settings model has checked its form) as a plain number."""
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    suffix = match.group(2) or ""
    return Decimal(text[:len(text) - len(suffix)]) * _SUFFIX[suffix]


def millicores(text: str) -> int:
    return math.floor(quantity(text) * 1000)


def megabytes(text: str) -> int:
    return math.floor(quantity(text) / 10**6)


def _share(amount: int | None, weight: int) -> dict:
    if amount is None:
        return {"quota": 0, "limit": UNLIMITED, "overQuotaWeight": weight}
    return {"quota": amount, "limit": amount, "overQuotaWeight": weight}


def tenant_resources(tenant: Tenant) -> dict:
    quota = tenant.quota
    weight = tenant.over_quota_weight
    gpu = _share(quota.gpu, weight)
    if quota.mig:
        gpu["limit"] = UNLIMITED
    return {"gpu": gpu,
            "cpu": _share(millicores(quota.cpu) if quota.cpu is not None else None, weight),
            "memory": _share(megabytes(quota.memory) if quota.memory is not None else None, weight)}


def _queue(name: str, spec: dict) -> dict:
    return {"apiVersion": QUEUE_API, "kind": "Queue",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpuboot"}}, "spec": spec}


def queues(kai: KaiScheduler, tenants: list[Tenant]) -> list[dict]:
    """The parent queue (its quota the sum of its children's, no limit), then one per tenant."""
    children = [(tenant, tenant_resources(tenant)) for tenant in tenants]
    parent_resources = {kind: {"quota": sum(resources[kind]["quota"] for _, resources in children),
                               "limit": UNLIMITED, "overQuotaWeight": 1} for kind in ("gpu", "cpu", "memory")}
    found = [_queue(kai.parent_queue, {"displayName": "The cluster's tenants", "resources": parent_resources})]
    for tenant, resources in children:
        found.append(_queue(tenant.name, {"displayName": f"Tenant {tenant.name}", "parentQueue": kai.parent_queue,
                                          "resources": resources}))
    return found


def queue_admission() -> list[dict]:
    """A tenant's objects name no queue but its own (checked by the API server on every create
    and update in a namespace labelled as a tenant's; objects without the label pass)."""
    label = QUEUE_LABEL
    return admission_policy(POLICY_NAME, {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "namespaceSelector": {"matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]},
            "resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                               "resources": ["*"]}]},
        # Cluster-scoped objects are never skipped by a namespace selector: only namespaced ones are
        # judged. A cluster-scoped request has no namespace key at all, and a condition that errors
        # falls to failurePolicy (Fail): every cluster-scoped write would be refused.
        "matchConditions": [{"name": "namespaced",
                             "expression": "has(request.namespace) && request.namespace != ''"}],
        "validations": [{
            "expression": (f"!has(object.metadata.labels) || !('{label}' in object.metadata.labels) || "
                           f"object.metadata.labels['{label}'] == namespaceObject.metadata.labels['{TENANT_LABEL}']"),
            "messageExpression": (f"'{label} may only name the queue of tenant ' + "
                                  f"namespaceObject.metadata.labels['{TENANT_LABEL}']"),
            "reason": "Forbidden"}]})


def kai_values(kai_release: dict) -> dict:
    """The KAI chart's values: its images exactly as the matrix pins them (containerd sends
    their pulls to the mirror under these names), and no default queue, so every pod KAI
    schedules is counted against a tenant's queue."""
    return {"global": {"registry": kai_release["registry"], "tag": str(kai_release["version"])},
            "defaultQueue": {"createDefaultQueue": False}}

