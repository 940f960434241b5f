"""TEST DOUBLES for the render tests: of the NicClusterPolicy's documented spec (a closed
schema, for machines without the upstream source trees; where they are, the real CRD judges the
policy in test_addon_objects_dry_run.py), and of the RDMA shared device plugin's configuration
rules as the plugin applies them at start (github.com/Mellanox/k8s-rdma-shared-dev-plugin,
pkg/resources: ValidateConfigs), a hardware operand's contract."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema

HERE = Path(__file__).resolve().parent
POLICY_SCHEMA = HERE / "nic_cluster_policy.schema.json"
# The plugin's own resource name rule.
RESOURCE_NAME = re.compile(r"^[a-zA-Z0-9_]+$")


class ContractError(ValueError):
    pass


def _check(schema: dict, body: dict, what: str) -> None:
    error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(schema).iter_errors(body))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or what
        raise ContractError(f"{what}: {where}: {error.message}")


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
