"""Helm's hooks sorted as a sync runs them (playbooks/filter_plugins/chart_hooks.py), on objects
shaped as `helm template` prints them: the hooks of the pinned GPU Operator, NFD, Network
Operator, tigera-operator and Argo CD charts use every shape tested here."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from tests.support.modules import load_filter

hooks = load_filter("chart_hooks")


def obj(kind: str, name: str, hook: str | None = None, weight: str | None = None, namespace: str = "ns") -> dict:
    annotations = {}
    if hook is not None:
        annotations["helm.sh/hook"] = hook
    if weight is not None:
        annotations["helm.sh/hook-weight"] = weight
    meta = {"name": name, "namespace": namespace, **({"annotations": annotations} if annotations else {})}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


def names(objects: list[dict]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]


def test_delete_rollback_and_test_hooks_are_never_applied():
    rendered = [obj("Deployment", "operator"),
                obj("Job", "nfd-prune", "post-delete"),
                obj("Job", "gpu-operator-cleanup-crd", "pre-delete"),
                obj("Job", "tigera-operator-uninstall", "pre-delete"),
                obj("Pod", "chart-test", "test"),
                obj("Pod", "legacy-test", "test-success"),
                obj("Job", "undo", "pre-rollback,post-rollback")]
    parts = hooks.chart_hook_split(rendered)
    assert names(parts["chart"]) == ["operator"]
    assert parts["before"] == [] and parts["after"] == []
    assert names(parts["dropped"]) == ["nfd-prune", "gpu-operator-cleanup-crd", "tigera-operator-uninstall",
                                       "chart-test", "legacy-test", "undo"]


def test_install_and_upgrade_hooks_go_before_or_after_the_chart_in_weight_order():
    rendered = [obj("Job", "upgrade-crd", "pre-upgrade", "1"),
                obj("ServiceAccount", "upgrade-crd", "pre-upgrade", "0"),
                obj("ClusterRole", "upgrade-crd", "pre-install,pre-upgrade", "0"),
                obj("Job", "apply-crds", "pre-install,pre-upgrade", "-5"),
                obj("ConfigMap", "settings"),
                obj("Job", "post", "post-install,post-upgrade", "2"),
                obj("Job", "post-first", "post-install", "-1")]
    parts = hooks.chart_hook_split(rendered)
    assert [(o["kind"], o["metadata"]["name"]) for o in parts["before"]] == [
        ("Job", "apply-crds"), ("ServiceAccount", "upgrade-crd"), ("ClusterRole", "upgrade-crd"), ("Job", "upgrade-crd")]
    assert names(parts["chart"]) == ["settings"]
    assert names(parts["after"]) == ["post-first", "post"]
    assert parts["dropped"] == []


def test_a_hook_for_install_and_delete_is_applied_and_never_removed():
    # The same ServiceAccount serves an install hook and, under the same name, a delete hook.
    rendered = [obj("ServiceAccount", "hooks", "pre-install,pre-delete"), obj("ServiceAccount", "hooks", "post-delete"),
                obj("Job", "cleanup", "post-delete")]
    parts = hooks.chart_hook_split(rendered)
    assert names(parts["before"]) == ["hooks"]
    assert names(parts["dropped"]) == ["cleanup"]


def test_crds_are_apart_and_empty_documents_ignored():
    rendered = [None, obj("CustomResourceDefinition", "clusterpolicies.nvidia.com", namespace=""), obj("Service", "s")]
    parts = hooks.chart_hook_split(rendered)
    assert names(parts["crds"]) == ["clusterpolicies.nvidia.com"]
    assert names(parts["chart"]) == ["s"]


def test_an_unknown_hook_stops_naming_the_object():
    with pytest.raises(AnsibleFilterError, match=r"Job ns/odd carries helm.sh/hook pre-sync"):
        hooks.chart_hook_split([obj("Job", "odd", "pre-install, pre-sync")])


def test_a_weight_that_is_no_integer_stops_naming_the_object():
    with pytest.raises(AnsibleFilterError, match=r"Job ns/w has helm.sh/hook-weight 'heavy'"):
        hooks.chart_hook_split([obj("Job", "w", "pre-install", "heavy")])


def test_the_filter_is_registered_under_its_name():
    assert hooks.FilterModule().filters()["chart_hook_split"] is hooks.chart_hook_split
