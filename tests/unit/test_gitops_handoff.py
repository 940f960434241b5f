"""The GitOps handoff's judgements, without a cluster: which Applications are not Synced and
Healthy and why (the words Argo CD gives), the repository data `up` hands the phase, the notice
a phase gives the operator, and what gpuboot keeps applying after the handoff."""
from __future__ import annotations

from pathlib import Path

import yaml

from gpuboot.ansible.translate import translate
from gpuboot.config.loader import load_cluster
from gpuboot.gitops import repo
from gpuboot.phases.catalog import UP
from gpuboot.phases.inputs import phase_inputs
from tests.support.modules import load_module

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "inventories" / "sample" / "inventory.yml"
apps = load_module("gpuboot_argocd_apps")
push = load_module("gpuboot_gitops_push")


def app(name: str, sync: str = "Synced", health: str = "Healthy", **status) -> dict:
    return {"metadata": {"name": name},
            "status": {"sync": {"status": sync}, "health": {"status": health}, **status}}


def test_every_expected_application_synced_and_healthy_is_no_problem():
    found = {a["metadata"]["name"]: a for a in (app("root"), app("tenant-a"))}
    assert apps.problems(found, ["root", "tenant-a"]) == {}


def test_a_missing_or_failing_application_is_named_with_argo_cds_reasons():
    found = {
        "root": app("root"),
        "tenant-a": app("tenant-a", "OutOfSync", "Missing",
                        conditions=[{"type": "ComparisonError", "message": "rpc error: authentication required"}]),
        "addon-gpu-operator": app("addon-gpu-operator", "Synced", "Degraded",
                                  resources=[{"kind": "Deployment", "name": "gpu-operator", "namespace": "gpu-operator",
                                              "status": "Synced",
                                              "health": {"status": "Degraded", "message": "0/1 replicas available"}},
                                             {"kind": "ConfigMap", "name": "fine", "status": "Synced"}],
                                  operationState={"phase": "Failed", "message": "one or more objects failed to apply"}),
    }
    problems = apps.problems(found, ["root", "tenant-a", "tenant-b", "addon-gpu-operator"])
    assert set(problems) == {"tenant-a", "tenant-b", "addon-gpu-operator"}
    assert problems["tenant-b"].startswith("does not exist yet")
    assert "sync OutOfSync, health Missing" in problems["tenant-a"]
    assert "ComparisonError: rpc error: authentication required" in problems["tenant-a"]
    gpu = problems["addon-gpu-operator"]
    assert "gpu-operator/Deployment/gpu-operator Synced Degraded: 0/1 replicas available" in gpu
    assert "last sync Failed: one or more objects failed to apply" in gpu and "ConfigMap" not in gpu


def test_up_hands_the_phase_the_rendered_repository_with_its_key_files():
    cluster = load_cluster(SAMPLE)
    phase = {p.name: p for p in UP}["gitops_handoff"]
    data = phase_inputs(phase, cluster)["gpuboot_gitops_repository"]
    rendered = repo.Repository(cluster)
    assert data["directory"] == "clusters/h200-prod" == str(rendered.root)
    assert set(data["files"]) == {str(p.relative_to(rendered.root)) for p in rendered.render()}
    assert data["key_file"] == "/etc/gpuboot/secrets/gitops-deploy-key"
    assert data["known_hosts_file"] == "/etc/gpuboot/gitops-known-hosts"
    # The handoff waits for every Application the directory declares, the root first.
    names = push.applications(data["files"])
    assert names[0] == yaml.safe_load(data["files"]["argocd/root.yaml"])["metadata"]["name"] == "h200-prod-root"
    assert {"addon-calico", "addon-gpu-operator", "tenant-research"} <= set(names)
    assert len(names) == len(set(names)) == 1 + len(rendered.applications)
    # Other phases get nothing of it: rendering the repository is the handoff's cost alone.
    assert all(phase_inputs(p, cluster) == {} for p in UP if p.name != "gitops_handoff")


def test_a_relative_key_file_is_the_inventorys_own(tmp_path):
    copy = tmp_path / "sample"
    __import__("shutil").copytree(SAMPLE.parent, copy)
    settings = copy / "group_vars" / "all.yml"
    text = settings.read_text().replace("/etc/gpuboot/secrets/gitops-deploy-key", "secrets/deploy-key")
    settings.write_text(text)
    cluster = load_cluster(copy / "inventory.yml")
    data = phase_inputs({p.name: p for p in UP}["gitops_handoff"], cluster)["gpuboot_gitops_repository"]
    assert data["key_file"] == str(copy / "secrets" / "deploy-key")


def test_a_phase_notice_reaches_the_operator_and_plain_results_stay_quiet():
    notice = translate({"event": "runner_on_ok", "event_data": {
        "host": "cp01", "task": "Add-on chart | say that Git owns gpu-operator",
        "res": {"gpuboot_notice": "gpu-operator is owned by Argo CD", "changed": False}}})
    assert notice.status == "ok" and notice.message == "gpu-operator is owned by Argo CD"
    plain = translate({"event": "runner_on_ok", "event_data": {"host": "cp01", "task": "t", "res": {"changed": False}}})
    assert plain.message == ""


def test_what_gpuboot_keeps_applying_after_the_handoff_is_what_the_repository_leaves_out():
    charts = yaml.safe_load((ROOT / "playbooks" / "group_vars" / "all" / "charts.yml").read_text())
    assert repo.KEPT_BY_GPUBOOT == {"values.yaml", *charts["chart_install_kept_by_gpuboot"]}
    files = repo.Repository(load_cluster(SAMPLE)).render()
    assert not any(path.name in charts["chart_install_kept_by_gpuboot"] for path in files)
    # Each add-on's Application carries the release `up` looks for.
    for addon in repo.ADDONS:
        application = yaml.safe_load(files[Path("clusters/h200-prod/argocd/applications") / f"addon-{addon.name}.yaml"])
        assert application["metadata"]["labels"][repo.CHART_RELEASE_LABEL] == addon.release


def test_only_an_application_whose_comparison_failed_is_refreshed():
    starting = app("root", "Unknown", "Healthy", conditions=[
        {"type": "ComparisonError", "message": "dial tcp 10.0.0.1:8081: connect: connection refused"}])
    assert apps.comparison_failed(starting)
    assert not apps.comparison_failed(app("root"))
    assert not apps.comparison_failed(app("t", "OutOfSync", conditions=[{"type": "SyncError", "message": "x"}]))
