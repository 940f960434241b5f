"""The release namespace on a rendered chart's namespaced objects that name none.

`helm template --namespace NS` sets `.Release.Namespace`, but a template that leaves
`metadata.namespace` out prints an object with no namespace (the SR-IOV operator's subchart in
the Network Operator's chart renders its Deployment and ConfigMap so). Helm and Argo CD put such
an object in the release's (the Application's destination) namespace; `kubectl apply -f` puts it
in `default`, where its pods find neither their ServiceAccount nor their ConfigMap. gpuboot
applies a chart as Argo CD syncs it, so it names the namespace as Argo CD would.

An object of a kind known to be cluster-wide (Kubernetes' own, or a CRD in the same render that
says `scope: Cluster`) is left as it is. Any other kind is taken as namespaced: were it in fact
cluster-wide, kubectl drops the namespace from it before it asks the server (its builder's
FilterNamespace), so the guess never misplaces an object.

What an earlier gpuboot applied with `kubectl apply -f` went to `default`: those objects, where
gpuboot's field manager made them, are removed once the chart's objects are in place."""
from __future__ import annotations

import copy

# Kubernetes' own cluster-wide kinds, by API group ("" is the core group).
CLUSTER_WIDE = frozenset({
    ("", "Namespace"), ("", "Node"), ("", "PersistentVolume"), ("", "ComponentStatus"),
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"),
    ("admissionregistration.k8s.io", "MutatingAdmissionPolicy"),
    ("admissionregistration.k8s.io", "MutatingAdmissionPolicyBinding"),
    ("apiextensions.k8s.io", "CustomResourceDefinition"),
    ("apiregistration.k8s.io", "APIService"),
    ("authentication.k8s.io", "TokenReview"), ("authentication.k8s.io", "SelfSubjectReview"),
    ("authorization.k8s.io", "SubjectAccessReview"), ("authorization.k8s.io", "SelfSubjectAccessReview"),
    ("authorization.k8s.io", "SelfSubjectRulesReview"),
    ("certificates.k8s.io", "CertificateSigningRequest"), ("certificates.k8s.io", "ClusterTrustBundle"),
    ("flowcontrol.apiserver.k8s.io", "FlowSchema"), ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"),
    ("networking.k8s.io", "IngressClass"), ("networking.k8s.io", "IPAddress"), ("networking.k8s.io", "ServiceCIDR"),
    ("node.k8s.io", "RuntimeClass"),
    ("rbac.authorization.k8s.io", "ClusterRole"), ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("resource.k8s.io", "DeviceClass"), ("resource.k8s.io", "ResourceSlice"), ("resource.k8s.io", "DeviceTaintRule"),
    ("scheduling.k8s.io", "PriorityClass"),
    ("storage.k8s.io", "StorageClass"), ("storage.k8s.io", "CSIDriver"), ("storage.k8s.io", "CSINode"),
    ("storage.k8s.io", "VolumeAttachment"), ("storage.k8s.io", "VolumeAttributesClass"),
})


def _group_kind(obj: dict) -> tuple[str, str]:
    api_version = str(obj.get("apiVersion", ""))
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    return group, str(obj.get("kind", ""))


def cluster_wide_kinds(objects: list) -> frozenset[tuple[str, str]]:
    """Kubernetes' cluster-wide kinds and those of the render's own CRDs with `scope: Cluster`."""
    defined = set()
    for obj in objects or []:
        if isinstance(obj, dict) and _group_kind(obj) == ("apiextensions.k8s.io", "CustomResourceDefinition"):
            spec = obj.get("spec") or {}
            if spec.get("scope") == "Cluster":
                defined.add((str(spec.get("group", "")), str((spec.get("names") or {}).get("kind", ""))))
    return CLUSTER_WIDE | defined


def chart_namespaced(objects: list, namespace: str) -> list:
    """The objects, each namespaced one that names no namespace given `namespace`; the input is
    not changed, and an object that names its namespace keeps it."""
    wide = cluster_wide_kinds(objects)
    placed = []
    for obj in objects or []:
        if isinstance(obj, dict) and _group_kind(obj) not in wide and not (obj.get("metadata") or {}).get("namespace"):
            obj = copy.deepcopy(obj)
            obj["metadata"] = {**(obj.get("metadata") or {}), "namespace": namespace}
        placed.append(obj)
    return placed


def chart_misplaced(objects: list, namespace: str) -> list:
    """The objects chart_namespaced places, as an earlier `kubectl apply -f` put them: in
    `default`. None where the release's namespace is `default` itself."""
    if namespace == "default":
        return []
    placed = chart_namespaced(objects, namespace)
    return [{**obj, "metadata": {**obj["metadata"], "namespace": "default"}}
            for before, obj in zip(objects or [], placed) if obj is not before]


def managed_by(listed: dict, manager: str) -> list[str]:
    """`kind.group/name` of each object in `kubectl get -o json`'s answer (a List, or one object)
    that `manager` has fields of: what that field manager applied, never an object of the same
    name that someone else made."""
    items = listed.get("items", []) if listed.get("kind") == "List" else [listed] if listed else []
    names = []
    for obj in items:
        meta = obj.get("metadata") or {}
        if any(entry.get("manager") == manager for entry in meta.get("managedFields") or []):
            group, kind = _group_kind(obj)
            names.append(f"{kind}{'.' + group if group else ''}/{meta.get('name', '')}")
    return names


class FilterModule:
    def filters(self):
        return {"chart_namespaced": chart_namespaced, "chart_misplaced": chart_misplaced, "managed_by": managed_by}
