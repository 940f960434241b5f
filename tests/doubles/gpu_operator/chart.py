"""TEST DOUBLE of the NVIDIA GPU Operator chart's values contract and of what the operator
deploys from them. The real chart and operator cannot be had here (no chart repository,
no registry); this double checks values as strictly as the chart's documented keys allow
(an unknown or mistyped key is an error, where the real chart would silently ignore it),
and derives the images the operator runs per node the way the operator does: operands from
the values, the driver image tag from the node's OS and kernel at run time."""
from __future__ import annotations

from typing import Any

STR, BOOL, INT, LIST, DICT = str, bool, int, list, dict

IMAGE = {"repository": STR, "image": STR, "version": STR}
# The keys gpuboot may set, from the chart's documented values (gpu-operator v25.3).
SCHEMA: dict[str, Any] = {
    "operator": {**IMAGE, "defaultRuntime": STR},
    "validator": IMAGE,
    "nfd": {"enabled": BOOL},
    "node-feature-discovery": {"image": {"repository": STR, "tag": STR}},
    "driver": {**IMAGE, "enabled": BOOL, "kernelModuleType": ("auto", "open", "proprietary"), "usePrecompiled": BOOL,
               "manager": IMAGE, "rdma": {"enabled": BOOL, "useHostMofed": BOOL},
               "upgradePolicy": {"autoUpgrade": BOOL, "maxParallelUpgrades": INT, "maxUnavailable": STR},
               "nvidiaDriverCRD": {"enabled": BOOL, "deployDefaultCR": BOOL},
               "repoConfig": {"configMapName": STR}, "certConfig": {"name": STR}},
    "toolkit": {**IMAGE, "enabled": BOOL, "env": LIST},
    "cdi": {"enabled": BOOL, "default": BOOL},
    "devicePlugin": {**IMAGE, "enabled": BOOL, "config": {"name": STR, "default": STR}},
    "gfd": {**IMAGE, "enabled": BOOL},
    "dcgmExporter": {**IMAGE, "enabled": BOOL},
    "mig": {"strategy": ("single", "mixed")},
    "migManager": {**IMAGE, "enabled": BOOL, "config": {"name": STR, "default": STR}},
}
TOOLKIT_ENV = {"CONTAINERD_CONFIG", "CONTAINERD_SOCKET", "CONTAINERD_RUNTIME_CLASS", "RUNTIME_CONFIG_SOURCE"}


class ValuesError(ValueError):
    pass


def check_values(values: dict, schema: dict = SCHEMA, path: str = "") -> None:
    """Raise ValuesError on the first unknown key, wrong type or value out of its choices."""
    if not isinstance(values, dict):
        raise ValuesError(f"{path or 'values'}: a mapping is required, got {type(values).__name__}")
    for key, value in values.items():
        here = f"{path}.{key}" if path else key
        if key not in schema:
            raise ValuesError(f"{here}: not a key of the chart (known here: {', '.join(schema)})")
        want = schema[key]
        if isinstance(want, dict):
            check_values(value, want, here)
        elif isinstance(want, tuple):
            if value not in want:
                raise ValuesError(f"{here}: {value!r} is not one of {want}")
        elif want is INT and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValuesError(f"{here}: an integer is required, got {value!r}")
        elif not isinstance(value, want):
            raise ValuesError(f"{here}: {want.__name__} required, got {type(value).__name__} {value!r}")
    for item in (values.get("env") or []) if path == "toolkit" else []:
        if set(item) != {"name", "value"} or item["name"] not in TOOLKIT_ENV:
            raise ValuesError(f"toolkit.env: {item!r} is not a toolkit setting ({', '.join(sorted(TOOLKIT_ENV))})")


def _enabled(values: dict, key: str, default: bool = True) -> bool:
    return bool((values.get(key) or {}).get("enabled", default))


def _image(section: dict, suffix: str = "") -> str:
    return f"{section['repository']}/{section['image']}:{section['version']}{suffix}"


def deployed_images(values: dict, labels: dict[str, dict], drivers: list[dict], nodes: dict[str, dict]) -> set[str]:
    """The images the operator runs for these values on these nodes. `nodes`: name -> the
    facts NFD would report (os_tag, kernel); `labels`: name -> labels gpuboot set;
    `drivers`: NVIDIADriver objects (used when the values turn their CRD on)."""
    images = {_image(values["operator"]), _image(values["validator"])}
    nfd = values["node-feature-discovery"]["image"]
    if _enabled(values, "nfd"):
        images.add(f"{nfd['repository']}:{nfd['tag']}")
    for key in ("toolkit", "devicePlugin", "gfd", "dcgmExporter"):
        if _enabled(values, key):
            images.add(_image(values[key]))
    # The MIG manager runs where GFD finds a MIG-capable GPU: the nodes labelled with a layout.
    if _enabled(values, "migManager") and any("nvidia.com/mig.config" in lb for lb in labels.values()):
        images.add(_image(values["migManager"]))
    driver = values.get("driver") or {}
    if not driver.get("enabled", True):
        return images
    use_crd = (driver.get("nvidiaDriverCRD") or {}).get("enabled", False)
    for name, facts in nodes.items():
        node_labels = labels.get(name, {})
        if node_labels.get("nvidia.com/gpu.deploy.driver") == "false":
            continue
        if use_crd:
            spec = next((d["spec"] for d in drivers
                         if all(node_labels.get(k, "true" if k == "nvidia.com/gpu.present" else None) == v
                                for k, v in d["spec"]["nodeSelector"].items())), None)
            if spec is None:
                continue
        else:
            spec = driver
        tag = (f"{spec['version']}-{facts['kernel']}-{facts['os_tag']}" if spec.get("usePrecompiled")
               else f"{spec['version']}-{facts['os_tag']}")
        images.add(f"{spec['repository']}/{spec['image']}:{tag}")
        images.add(_image(driver["manager"]))
    return images
