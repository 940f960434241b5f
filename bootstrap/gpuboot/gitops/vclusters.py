"""A tenant's vCluster: the chart's values and what the tenant's namespace must allow for it.
Pure data from the validated settings and the release matrix; the repository writer lays it out.

The values keep to keys of the vcluster chart at the matrix's version (read from its
values.yaml and values.schema.json, which refuses any other key):
- the Kubernetes distro, the OSS control plane image and every image the chart deploys pinned
  to what the matrix lists, so the mirror holds exactly what the nodes pull;
- vCluster's own ResourceQuota, LimitRange and NetworkPolicy off: the tenant's bundle already
  bounds the namespace the vCluster's pods run in, and two quotas would disagree;
- pods synced to the host run at the tenant's lowest priority tier (its tier quota refuses a
  tier it was not given, and vCluster would otherwise pass none);
- no telemetry (an air gap has no way out, and a tenant's cluster should not phone home)."""
from __future__ import annotations

from gpuboot.config.model import PRIORITY_TIERS, Tenant
from gpuboot.gitops.tenants import priority_class_name
from gpuboot.mirror.refs import parse_image

# The chart's release name in the tenant's namespace: its control plane pods carry
# app=vcluster and release=<this>.
RELEASE = "vcluster"


def _image(text: str) -> dict:
    ref = parse_image(text)
    return {"registry": ref.registry, "repository": ref.repository, "tag": ref.tag}


def lowest_tier(tenant: Tenant) -> str:
    return max(tenant.priority_classes, key=PRIORITY_TIERS.index)


def values(tenant: Tenant, images: dict[str, str]) -> dict:
    storage = tenant.vcluster
    claim: dict = {"enabled": True, "size": storage.storage_size}
    if storage.storage_class:
        claim["storageClass"] = storage.storage_class
    rewrite = _image(images["rewriteHosts"])
    return {
        "controlPlane": {
            "distro": {"k8s": {"enabled": True, "image": _image(images["distro"])}},
            "statefulSet": {"image": _image(images["controlPlane"]), "persistence": {"volumeClaim": claim}},
            "coredns": {"deployment": {"image": images["coredns"]}},
        },
        "sync": {"toHost": {"pods": {"priorityClassName": priority_class_name(lowest_tier(tenant)),
                                     "rewriteHosts": {"initContainer": {"image": rewrite}}}}},
        "policies": {"resourceQuota": {"enabled": False}, "limitRange": {"enabled": False},
                     "networkPolicy": {"enabled": False}},
        "telemetry": {"enabled": False},
    }


def api_server_access(api_servers: list[str], api_port: int) -> dict:
    """The egress vCluster's control plane needs beside the tenant's default-deny: the cluster's
    API server, reached through the kubernetes Service, whose endpoints are the control planes'
    own addresses (a network policy judges the connection after the Service's translation)."""
    return {"podSelector": {"matchLabels": {"app": "vcluster", "release": RELEASE}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": f"{address}/32"}} for address in api_servers],
                        "ports": [{"protocol": "TCP", "port": api_port}]}]}
