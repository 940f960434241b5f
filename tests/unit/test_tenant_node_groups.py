"""A tenant bound to a node group (`node_group`): its quota is counted in that group's units
(time-sliced replicas, MIG devices) and must fit what the group's GPU nodes offer; the group's
GPU nodes carry the label the tenant's pods must select, and the tenant's namespace names it."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster

TESTS = Path(__file__).resolve().parents[1]
FLEET = TESTS / "fixtures" / "mixed-fleet"


def site(tmp_path: Path, tenants: list[dict]) -> Path:
    root = tmp_path / "site"
    shutil.copytree(FLEET, root)
    settings = root / "group_vars" / "all.yml"
    data = yaml.safe_load(settings.read_text())
    data["gpuboot"]["tenants"] = tenants
    settings.write_text(yaml.safe_dump(data, sort_keys=False))
    return root / "hosts.ini"


def errors(inventory: Path, capsys) -> list[str]:
    assert run(["validate", str(inventory), "--skip-files"]) == 2
    return capsys.readouterr().err.splitlines()[1:]


def test_a_quota_that_fits_the_time_sliced_group_is_valid_and_its_nodes_are_labelled(tmp_path):
    # l40s_roce: 2 nodes x 4 L40S x 2 time slices = 16 nvidia.com/gpu.
    inventory = site(tmp_path, [{"name": "notebooks", "node_group": "l40s_roce", "quota": {"gpu": 16}},
                                {"name": "training", "quota": {"gpu": 32}}])
    cluster = load_cluster(inventory)
    labels = {name: node["labels"] for name, node in cluster.extravars()["gpuboot_gpu"]["nodes"].items()}
    assert labels["l40s01"]["node-group.gpuboot.io/l40s_roce"] == "true"
    assert not any(key.startswith("node-group.gpuboot.io/") for key in labels["hgx01"])


def test_a_quota_above_what_the_group_offers_is_located(tmp_path, capsys):
    inventory = site(tmp_path, [{"name": "notebooks", "node_group": "l40s_roce", "quota": {"gpu": 12}},
                                {"name": "lab", "node_group": "l40s_roce", "quota": {"gpu": 8}}])
    found = errors(inventory, capsys)
    assert len(found) == 1
    assert "gpuboot.tenants[0].quota.gpu: the quotas of the tenants on node group l40s_roce add up to 20 " \
           "nvidia.com/gpu (notebooks 12, lab 8), but its GPU nodes offer 16 (gpu.count x time_slicing_replicas)" in found[0]
    assert "all.yml:" in found[0]


def test_a_node_group_without_gpu_workers_is_refused_naming_those_that_have_some(tmp_path, capsys):
    for group in ("cpu_workers", "no_such_group"):
        inventory = site(tmp_path / group, [{"name": "notebooks", "node_group": group, "quota": {"gpu": 1}}])
        found = errors(inventory, capsys)
        assert len(found) == 1
        assert f"gpuboot.tenants[0].node_group: the node group {group} holds no GPU worker of this inventory" in found[0]
        assert "fix: name an inventory group of GPU workers" in found[0]


def test_the_namespace_names_the_node_group_and_one_admission_rule_enforces_it(tmp_path):
    inventory = site(tmp_path, [{"name": "notebooks", "node_group": "l40s_roce", "quota": {"gpu": 4}}])
    settings = inventory.parent / "group_vars" / "all.yml"
    data = yaml.safe_load(settings.read_text())
    data["gpuboot"]["gitops"] = {"repo_url": "https://git.example.internal/platform/fleet.git"}
    settings.write_text(yaml.safe_dump(data))
    assert run(["gitops", "render", str(inventory), "--out", str(tmp_path / "repo")]) == 0
    repo = tmp_path / "repo" / "clusters" / "fleet"
    namespace = yaml.safe_load((repo / "tenants" / "notebooks" / "namespace.yaml").read_text())
    assert namespace["metadata"]["labels"]["gpuboot.io/node-group"] == "l40s_roce"
    policy, binding = yaml.safe_load_all((repo / "tenants" / "node-groups" / "admission.yaml").read_text())
    assert policy["kind"] == "ValidatingAdmissionPolicy" and binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["key"] == "gpuboot.io/node-group"


def test_a_release_that_does_not_load_says_only_that(tmp_path, capsys):
    inventory = site(tmp_path, [{"name": "notebooks", "node_group": "l40s_roce", "quota": {"gpu": 4}}])
    settings = inventory.parent / "group_vars" / "all.yml"
    settings.write_text(settings.read_text().replace("release: k8s-1.36", "release: k8s-9.99"))
    found = errors(inventory, capsys)
    assert len(found) == 1 and "gpuboot.release" in found[0]
