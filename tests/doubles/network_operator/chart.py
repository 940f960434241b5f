"""TEST DOUBLE of the NVIDIA Network Operator chart's values contract, of the NicClusterPolicy's
documented spec, and of what the operators deploy from them. The real chart, CRDs and
operators cannot be had here (no chart repository, no registry, the Go modules refused);
this double checks values and the policy as strictly as their documented keys allow (an
unknown or mistyped key is an error, where the real chart would ignore it), checks the RDMA
shared device plugin's configuration with the rules the plugin itself applies at start
(github.com/Mellanox/k8s-rdma-shared-dev-plugin, pkg/resources: ValidateConfigs), and
derives the images deployed per node the way the operators do: operands from the values and
the policy, the DOCA driver tag from the node's kernel, OS and architecture at run time."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema

HERE = Path(__file__).resolve().parent
VALUES_SCHEMA = HERE.parent / "charts" / "network-operator" / "values.schema.json"
POLICY_SCHEMA = HERE / "nic_cluster_policy.schema.json"
# The real operator applies nv-ipam's CRDs itself, from its state-nv-ipam-cni manifests, once the
# NicClusterPolicy asks for nvIpam; its chart does not carry them (a real CRD's double).
NV_IPAM_CRD = HERE / "nv-ipam.nvidia.com_ippools.yaml"
# The plugin's own resource name rule.
RESOURCE_NAME = re.compile(r"^[a-zA-Z0-9_]+$")


class ContractError(ValueError):
    pass


def _check(schema: dict, body: dict, what: str) -> None:
    error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(schema).iter_errors(body))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or what
        raise ContractError(f"{what}: {where}: {error.message}")


def check_values(values: dict) -> None:
    _check(json.loads(VALUES_SCHEMA.read_text()), values, "values")


def check_policy(spec: dict) -> None:
    """The NicClusterPolicy spec, then the shared plugin's config as the plugin reads it."""
    schema = json.loads(POLICY_SCHEMA.read_text())
    _check(schema, spec, "NicClusterPolicy.spec")
    plugin = spec.get("rdmaSharedDevicePlugin")
    if plugin:
        try:
            config = json.loads(plugin["config"])
        except json.JSONDecodeError as exc:
            raise ContractError(f"rdmaSharedDevicePlugin.config is not JSON: {exc}") from None
        _check({**schema["definitions"]["sharedConfig"], "definitions": schema["definitions"]}, config,
               "rdmaSharedDevicePlugin.config")
        names: set[str] = set()
        for entry in config["configList"]:
            name = entry["resourceName"]
            if not RESOURCE_NAME.match(name):
                raise ContractError(f"resource name {name!r} contains invalid characters")
            if name in names:
                raise ContractError(f"resource name {name!r} already exists")
            names.add(name)
            if not any(entry["selectors"].values()) and not entry.get("devices"):
                raise ContractError(f"{name}: neither selectors nor devices")


def _split(section: dict) -> str:
    return f"{section['repository']}/{section['image']}:{section['version']}"


def _selected(affinity: dict, labels: dict[str, str]) -> bool:
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return any(all(labels.get(e["key"]) in e["values"] for e in term["matchExpressions"]) for term in terms)


def deployed_images(values: dict, spec: dict, nodes: dict[str, dict], mirror: str | None = None) -> set[str]:
    """The images the Network Operator (and its SR-IOV operator) run for these values and
    this NicClusterPolicy on these nodes. `nodes`: name -> {labels, kernel, os_tag, arch}.
    An image named by the mirror (the DOCA driver in an air gap) is reported by the upstream
    name the mirror keeps it under."""
    operator = values["operator"]
    images = {f"{operator['repository']}/{operator['image']}:{operator['tag']}"}
    init = (operator.get("ofedDriver") or {}).get("initContainer") or {}
    if init.get("enable"):
        images.add(_split(init))
    if (values.get("nfd") or {}).get("enabled"):
        # The chart's own Node Feature Discovery (master, worker and gc run one image).
        nfd = values["node-feature-discovery"]["image"]
        images.add(f"{nfd['repository']}:{nfd['tag']}")
    if (values.get("sriovNetworkOperator") or {}).get("enabled"):
        sriov = values["sriov-network-operator"]["images"]
        # The config daemon's init containers: one per CNI plugin image the chart names.
        images |= {sriov[k] for k in ("operator", "sriovConfigDaemon", "sriovDevicePlugin", "sriovCni", "ibSriovCni",
                                      "ovsCni", "rdmaCni") if sriov.get(k)}
    if spec.get("rdmaSharedDevicePlugin"):
        images.add(_split(spec["rdmaSharedDevicePlugin"]))
    for section in ("multus", "cniPlugins", "ipoib"):
        if (spec.get("secondaryNetwork") or {}).get(section):
            images.add(_split(spec["secondaryNetwork"][section]))
    if spec.get("nvIpam"):
        images.add(_split(spec["nvIpam"]))
    driver = spec.get("ofedDriver")
    if driver:
        repository = driver["repository"]
        if mirror and repository.startswith(mirror + "/"):
            repository = repository[len(mirror) + 1:]
        for facts in nodes.values():
            if not _selected(spec["nodeAffinity"], facts["labels"]):
                continue
            tag = (f"{driver['version']}-{facts['kernel']}-{facts['os_tag']}-{facts['arch']}"
                   if driver.get("forcePrecompiled") else f"{driver['version']}-{facts['os_tag']}-{facts['arch']}")
            images.add(f"{repository}/{driver['image']}:{tag}")
    return images
