"""Helm's hooks in a rendered chart, sorted the way a sync runs them.

`helm template` prints a chart's hooks with the rest of its objects. Applied as plain objects,
a delete hook runs at install: NFD's post-delete prune Job strips the NFD labels from every
node, the GPU Operator's pre-delete cleanup Job deletes its own custom resources,
tigera-operator's pre-delete Job can delete Calico's Installation. gpuboot applies a chart as
Argo CD syncs it after the handoff: pre-install/pre-upgrade hooks before the chart's objects
(PreSync), post-install/post-upgrade hooks after them (PostSync), each in the order of its
hook weight; delete, rollback and test hooks are never applied."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

HOOK = "helm.sh/hook"
WEIGHT = "helm.sh/hook-weight"
BEFORE = frozenset({"pre-install", "pre-upgrade", "crd-install"})  # crd-install: Helm 2's, a PreSync for Argo CD
AFTER = frozenset({"post-install", "post-upgrade"})
NEVER = frozenset({"pre-delete", "post-delete", "pre-rollback", "post-rollback", "test", "test-success",
                   "test-failure"})
# Within one weight, what others need comes first (a hook Job's ServiceAccount and RBAC).
KIND_RANK = ("Namespace", "ServiceAccount", "Secret", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "Role",
             "RoleBinding", "Service")


def _identity(obj: dict) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")


def _label(obj: dict) -> str:
    _, kind, namespace, name = _identity(obj)
    return f"{kind} {namespace + '/' if namespace else ''}{name}"


def hook_names(obj: dict) -> frozenset[str]:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(HOOK)
    if value is None:
        return frozenset()
    names = frozenset(part.strip() for part in str(value).split(",") if part.strip())
    unknown = names - BEFORE - AFTER - NEVER
    if unknown:
        raise AnsibleFilterError(
            f"{_label(obj)} carries {HOOK} {', '.join(sorted(unknown))}, a hook gpuboot does not know: it cannot tell "
            f"when to apply it. Known hooks: {', '.join(sorted(BEFORE | AFTER | NEVER))}.")
    return names


def _order(obj: dict) -> tuple[int, int, str]:
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(WEIGHT, "0")
    try:
        weight = int(str(raw).strip())
    except ValueError as err:
        raise AnsibleFilterError(f"{_label(obj)} has {WEIGHT} {raw!r}, not an integer.") from err
    kind = obj.get("kind", "")
    rank = KIND_RANK.index(kind) if kind in KIND_RANK else len(KIND_RANK)
    return weight, rank, _label(obj)


def chart_hook_split(objects: list) -> dict[str, list]:
    """A chart's rendered objects as {crds, before, chart, after, dropped}: CRDs, the hooks a sync
    runs before the chart's objects, the objects, the hooks it runs after them, and the hooks it
    never runs at install or upgrade (a hook named both before and after runs before). `dropped`
    leaves out any object that is also one of the others (the same kind, namespace and name), so
    removing the dropped ones from a cluster never removes what the chart keeps."""
    parts: dict[str, list] = {"crds": [], "before": [], "chart": [], "after": [], "dropped": []}
    for obj in objects or []:
        if not isinstance(obj, dict):
            continue
        hooks = hook_names(obj)
        if not hooks:
            parts["crds" if obj.get("kind") == "CustomResourceDefinition" else "chart"].append(obj)
        elif hooks & BEFORE:
            parts["before"].append(obj)
        elif hooks & AFTER:
            parts["after"].append(obj)
        else:
            parts["dropped"].append(obj)
    for part in ("before", "after"):
        parts[part].sort(key=_order)
    kept = {_identity(obj) for part in ("crds", "before", "chart", "after") for obj in parts[part]}
    parts["dropped"] = [obj for obj in parts["dropped"] if _identity(obj) not in kept]
    return parts


class FilterModule:
    def filters(self):
        return {"chart_hook_split": chart_hook_split}
