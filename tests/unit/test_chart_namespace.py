"""The release namespace on a rendered chart's namespaced objects that name none
(playbooks/filter_plugins/chart_namespace.py), as Argo CD places them: the SR-IOV operator's
subchart in the Network Operator's chart renders its Deployment and ConfigMap without one, and
`kubectl apply -f` put them in `default`, away from their ServiceAccount."""
from __future__ import annotations

from tests.support.modules import load_filter

namespaced = load_filter("chart_namespace")


def obj(api_version: str, kind: str, name: str, namespace: str | None = None) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def where(objects: list[dict]) -> dict[str, str | None]:
    return {f"{o['kind']}/{o['metadata']['name']}": o["metadata"].get("namespace") for o in objects}


def test_namespaced_objects_without_a_namespace_go_to_the_release_namespace():
    rendered = [obj("apps/v1", "Deployment", "sriov-network-operator"),
                obj("v1", "ConfigMap", "supported-nic-ids"),
                obj("v1", "ServiceAccount", "sriov-network-operator", "nvidia-network-operator"),
                obj("rbac.authorization.k8s.io/v1", "Role", "elsewhere", "kube-system")]
    assert where(namespaced.chart_namespaced(rendered, "nvidia-network-operator")) == {
        "Deployment/sriov-network-operator": "nvidia-network-operator",
        "ConfigMap/supported-nic-ids": "nvidia-network-operator",
        "ServiceAccount/sriov-network-operator": "nvidia-network-operator",
        # A namespace the template names is kept, whatever it is.
        "Role/elsewhere": "kube-system"}


def test_cluster_wide_kinds_stay_without_a_namespace():
    rendered = [obj("rbac.authorization.k8s.io/v1", "ClusterRole", "operator"),
                obj("v1", "Namespace", "nvidia-network-operator"),
                obj("scheduling.k8s.io/v1", "PriorityClass", "critical"),
                obj("resource.k8s.io/v1", "DeviceClass", "gpu.nvidia.com"),
                obj("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", "hooks"),
                obj("apiextensions.k8s.io/v1", "CustomResourceDefinition", "nicclusterpolicies.mellanox.com")]
    assert set(where(namespaced.chart_namespaced(rendered, "ns")).values()) == {None}


def test_a_crd_in_the_render_says_whether_its_kind_is_cluster_wide():
    crds = [{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "metadata": {"name": "nicclusterpolicies.mellanox.com"},
             "spec": {"group": "mellanox.com", "scope": "Cluster", "names": {"kind": "NicClusterPolicy"}}},
            {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "metadata": {"name": "sriovoperatorconfigs.sriovnetwork.openshift.io"},
             "spec": {"group": "sriovnetwork.openshift.io", "scope": "Namespaced",
                      "names": {"kind": "SriovOperatorConfig"}}}]
    rendered = crds + [obj("mellanox.com/v1alpha1", "NicClusterPolicy", "nic-cluster-policy"),
                       obj("sriovnetwork.openshift.io/v1", "SriovOperatorConfig", "default"),
                       # The same kind in another group is not the CRD's kind.
                       obj("example.com/v1", "NicClusterPolicy", "lookalike")]
    placed = where(namespaced.chart_namespaced(rendered, "ns"))
    assert placed["NicClusterPolicy/nic-cluster-policy"] is None
    assert placed["SriovOperatorConfig/default"] == "ns"
    assert placed["NicClusterPolicy/lookalike"] == "ns"


def test_the_rendered_objects_are_not_changed_and_their_order_is_kept():
    deployment = obj("apps/v1", "Deployment", "d")
    rendered = [obj("v1", "Service", "s"), deployment, None]
    placed = namespaced.chart_namespaced(rendered, "ns")
    assert [o["metadata"]["name"] if o else o for o in placed] == ["s", "d", None]
    assert "namespace" not in deployment["metadata"]
    assert namespaced.chart_namespaced(None, "ns") == []


def test_the_filter_is_registered():
    assert namespaced.FilterModule().filters()["chart_namespaced"] is namespaced.chart_namespaced


def test_misplaced_are_the_objects_an_earlier_kubectl_apply_put_in_default():
    rendered = [obj("apps/v1", "Deployment", "sriov-network-operator"),
                obj("v1", "ServiceAccount", "operator", "nvidia-network-operator"),
                obj("rbac.authorization.k8s.io/v1", "ClusterRole", "operator")]
    assert where(namespaced.chart_misplaced(rendered, "nvidia-network-operator")) == {
        "Deployment/sriov-network-operator": "default"}
    assert "namespace" not in rendered[0]["metadata"]
    # A release in `default` itself misplaced nothing.
    assert namespaced.chart_misplaced(rendered, "default") == []


def managed(kind: str, api_version: str, name: str, *managers: str) -> dict:
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": "default",
                         "managedFields": [{"manager": m, "operation": "Apply"} for m in managers]}}


def test_only_what_gpuboots_field_manager_made_is_named_for_removal():
    listed = {"apiVersion": "v1", "kind": "List", "items": [
        managed("Deployment", "apps/v1", "sriov-network-operator", "gpuboot", "kube-controller-manager"),
        managed("ConfigMap", "v1", "supported-nic-ids", "kubectl-client-side-apply"),
        managed("ServiceAccount", "v1", "hooks-sa", "gpuboot")]}
    assert namespaced.managed_by(listed, "gpuboot") == ["Deployment.apps/sriov-network-operator",
                                                        "ServiceAccount/hooks-sa"]
    # kubectl get answers one object as itself, and nothing found as an empty List or nothing.
    assert namespaced.managed_by(listed["items"][2], "gpuboot") == ["ServiceAccount/hooks-sa"]
    assert namespaced.managed_by({"kind": "List", "items": []}, "gpuboot") == []
    assert namespaced.managed_by({}, "gpuboot") == []
