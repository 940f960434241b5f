"""KAI scheduler queues from the tenants' quotas (bootstrap/gpuboot/gitops/queues.py), and the
mirror planning KAI only for a cluster that turns it on. The queues against a Queue CRD and the
admission rule on a real API server: tests/integration/test_gitops_tenants.py."""
from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest

from gpuboot import matrix
from gpuboot.config.loader import load_cluster
from gpuboot.config.model import QUANTITY, KaiScheduler, Tenant
from gpuboot.gitops import queues
from gpuboot.mirror import plan as mirror_plan

ROOT = Path(__file__).resolve().parents[2]
FOUR_TENANTS = ROOT / "tests" / "fixtures" / "four-tenants" / "hosts.ini"
SAMPLE = ROOT / "inventories" / "sample" / "inventory.yml"


@pytest.mark.parametrize(("text", "millicores", "megabytes"), [
    ("4", 4000, 0), ("500m", 500, 0), ("1.5", 1500, 0), ("2k", 2_000_000, 0),
    ("8Gi", 8_589_934_592_000, 8589), ("512Gi", 549_755_813_888_000, 549755), ("1M", 1_000_000_000, 1),
    ("1Ti", 1_099_511_627_776_000, 1_099_511),
])
def test_quantities_in_kais_units(text: str, millicores: int, megabytes: int):
    assert queues.millicores(text) == millicores
    assert queues.megabytes(text) == megabytes


def test_a_quantity_with_an_unknown_suffix_is_refused():
    assert queues.quantity("100Ki") == Decimal(102400)
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        queues.quantity("3Gb")


def test_every_suffix_the_settings_model_accepts_has_a_value():
    # The model's QUANTITY is the one pattern; each of its suffixes must convert.
    suffixes = re.search(r"\(([^()]*)\)\?\$$", QUANTITY).group(1).split("|")
    assert sorted(suffixes) == sorted(k for k in queues._SUFFIX if k)
    assert all(queues.quantity(f"2{s}") == 2 * queues._SUFFIX[s] for s in suffixes)


def test_a_tenants_queue_is_its_quota_rounded_down_and_unset_means_no_share_and_no_limit():
    tenant = Tenant(name="vision", quota={"gpu": 4, "cpu": "2500m", "memory": "1500Mi"}, over_quota_weight=2)
    assert queues.tenant_resources(tenant) == {
        "gpu": {"quota": 4, "limit": 4, "overQuotaWeight": 2},
        "cpu": {"quota": 2500, "limit": 2500, "overQuotaWeight": 2},
        # 1500 MiB is 1572.864 MB: rounded down, never above the ResourceQuota
        "memory": {"quota": 1572, "limit": 1572, "overQuotaWeight": 2}}
    bare = queues.tenant_resources(Tenant(name="bare"))
    assert bare["gpu"] == {"quota": 0, "limit": 0, "overQuotaWeight": 1}
    assert bare["cpu"] == bare["memory"] == {"quota": 0, "limit": -1, "overQuotaWeight": 1}


def test_a_tenant_with_mig_devices_has_no_gpu_limit_on_its_queue():
    # KAI counts a MIG device as a fraction of a GPU: a limit of the tenant's whole GPUs (here
    # none) would keep its MIG pods out; the ResourceQuota bounds the devices per profile.
    notebooks = queues.tenant_resources(Tenant(name="notebooks", quota={"mig": {"1g.10gb": 14}}))
    assert notebooks["gpu"] == {"quota": 0, "limit": -1, "overQuotaWeight": 1}
    both = queues.tenant_resources(Tenant(name="b", quota={"gpu": 8, "mig": {"3g.40gb": 2}}))
    assert both["gpu"] == {"quota": 8, "limit": -1, "overQuotaWeight": 1}


def test_the_parent_queue_sums_its_children_and_every_tenant_hangs_under_it():
    kai = KaiScheduler(enabled=True, parent_queue="research")
    found = queues.queues(kai, [Tenant(name="a", quota={"gpu": 3, "cpu": "1"}), Tenant(name="b", quota={"gpu": 5})])
    parent, *children = found
    assert parent["metadata"]["name"] == "research" and "parentQueue" not in parent["spec"]
    assert parent["spec"]["resources"]["gpu"] == {"quota": 8, "limit": -1, "overQuotaWeight": 1}
    assert parent["spec"]["resources"]["cpu"]["quota"] == 1000
    assert [(q["metadata"]["name"], q["spec"]["parentQueue"]) for q in children] == [("a", "research"),
                                                                                   ("b", "research")]
    assert {q["apiVersion"] for q in found} == {"scheduling.run.ai/v2"}


def test_kai_values_pin_the_matrix_images_and_create_no_default_queue():
    kai = matrix.load("k8s-1.36").model_extra["kai_scheduler"]
    values = queues.kai_values(kai)
    assert values["defaultQueue"] == {"createDefaultQueue": False}
    planned = matrix.load("k8s-1.36").component_images("kai_scheduler")
    # Every image the chart's values name is <registry>/<name>:<tag>, and the mirror plans each.
    assert planned and all(ref.startswith(values["global"]["registry"] + "/") and
                           ref.endswith(":" + values["global"]["tag"]) for ref in planned)


def test_the_mirror_plans_kai_only_for_a_cluster_that_turns_it_on():
    with_kai, without = load_cluster(FOUR_TENANTS), load_cluster(SAMPLE)
    assert with_kai.settings.kai_scheduler.enabled and not without.settings.kai_scheduler.enabled
    for cluster, wanted in ((with_kai, True), (without, False)):
        release = matrix.load(cluster.settings.release)
        plan = mirror_plan.build(release, mirror_plan.Target.of(cluster, release))
        charts = {c.name for c in plan.charts}
        images = {str(i.ref) for i in plan.images}
        assert ("kai-scheduler" in charts) is wanted
        assert set(release.component_images("kai_scheduler")) <= images if wanted else \
            not set(release.component_images("kai_scheduler")) & images
    # Without a cluster, only what every cluster needs.
    assert "kai-scheduler" not in {c.name for c in mirror_plan.build(matrix.load("k8s-1.36")).charts}
