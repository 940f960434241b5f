"""A tenant's vCluster (bootstrap/gpuboot/gitops/vclusters.py): its values against a closed
schema of the vcluster chart's values (a TEST DOUBLE, tests/doubles/vcluster: the chart cannot
be had here), the network policy that lets its control plane reach the API servers, and the
mirror planning its images only for a cluster with one."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from gpuboot import matrix
from gpuboot.config.loader import load_cluster
from gpuboot.config.model import Tenant
from gpuboot.gitops import vclusters
from gpuboot.mirror import plan as mirror_plan

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tests" / "doubles" / "vcluster" / "values.schema.json").read_text())
FOUR_TENANTS = ROOT / "tests" / "fixtures" / "four-tenants" / "hosts.ini"
IMAGES = matrix.entry("k8s-1.36")["images"]["vcluster"]


def test_values_keep_to_the_charts_keys_and_pin_every_image_the_mirror_holds():
    tenant = Tenant(name="vision", priority_classes=["training", "batch"],
                    vcluster={"enabled": True, "storage_class": "local-nvme", "storage_size": "20Gi"})
    values = vclusters.values(tenant, IMAGES)
    jsonschema.validate(values, SCHEMA)
    plane = values["controlPlane"]
    pinned = {f"{i['registry']}/{i['repository']}:{i['tag']}" for i in (
        plane["distro"]["k8s"]["image"], plane["statefulSet"]["image"],
        values["sync"]["toHost"]["pods"]["rewriteHosts"]["initContainer"]["image"])}
    pinned.add(plane["coredns"]["deployment"]["image"])
    assert pinned == set(IMAGES.values())
    assert plane["statefulSet"]["image"]["repository"] == "loft-sh/vcluster-oss"  # not the Pro default
    assert plane["statefulSet"]["persistence"]["volumeClaim"] == {"enabled": True, "size": "20Gi",
                                                                   "storageClass": "local-nvme"}
    # The tenant's bundle bounds the namespace: vCluster's own policies are off.
    assert {v["enabled"] for v in values["policies"].values()} == {False}
    assert values["telemetry"] == {"enabled": False}
    # Synced pods run at the tenant's lowest tier, which its tier quota allows.
    assert values["sync"]["toHost"]["pods"]["priorityClassName"] == "gpuboot-batch"


def test_the_double_schema_refuses_what_the_chart_would():
    values = vclusters.values(Tenant(name="a", vcluster={"enabled": True}), IMAGES)
    assert "storageClass" not in values["controlPlane"]["statefulSet"]["persistence"]["volumeClaim"]
    values["policies"]["resourceQuotas"] = {"enabled": False}
    with pytest.raises(jsonschema.ValidationError, match="resourceQuotas"):
        jsonschema.validate(values, SCHEMA)


def test_the_control_plane_reaches_the_api_servers_by_their_addresses_only():
    policy = vclusters.api_server_access(["10.0.0.11", "10.0.0.12"], 6443)
    assert policy["podSelector"] == {"matchLabels": {"app": "vcluster", "release": vclusters.RELEASE}}
    assert policy["policyTypes"] == ["Egress"]
    assert policy["egress"] == [{"to": [{"ipBlock": {"cidr": "10.0.0.11/32"}}, {"ipBlock": {"cidr": "10.0.0.12/32"}}],
                                 "ports": [{"protocol": "TCP", "port": 6443}]}]


def test_the_fleet_renders_one_vcluster_and_the_mirror_plans_its_images(tmp_path: Path):
    cluster = load_cluster(FOUR_TENANTS)
    assert [t.name for t in cluster.settings.tenants if t.vcluster.enabled] == ["llm-training"]
    release = matrix.load(cluster.settings.release)
    plan = mirror_plan.build(release, mirror_plan.Target.of(cluster, release))
    assert "vcluster" in {c.name for c in plan.charts}
    assert set(IMAGES.values()) <= {str(i.ref) for i in plan.images}
    sample = load_cluster(ROOT / "inventories" / "sample" / "inventory.yml")
    without = mirror_plan.build(release, mirror_plan.Target.of(sample, release))
    assert "vcluster" not in {c.name for c in without.charts}
    assert not set(IMAGES.values()) & {str(i.ref) for i in without.images}
    values = yaml.safe_load((ROOT / "tests" / "golden" / "gitops" / "four-tenants" / "tenants" / "llm-training"
                             / "vcluster" / "values.yaml").read_text())
    jsonschema.validate(values, SCHEMA)
