"""TEST DOUBLE of the NVIDIA GPU Operator chart's values contract and of what the operator
deploys from them. The real chart and operator cannot be had here (no chart repository,
no registry); this double checks values as strictly as the chart's documented keys allow
(an unknown or mistyped key is an error, where the real chart would silently ignore it),
and derives the images the operator runs per node the way the operator does: operands from
the values, the driver image tag from the node's OS and kernel at run time."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema

# The double chart's values contract (tests/doubles/charts/gpu-operator): the keys gpuboot may
# set, from the chart's documented values, every object closed (additionalProperties: false).
# helm itself enforces it when it renders the double chart; check_values applies the same file.
SCHEMA_FILE = Path(__file__).resolve().parents[1] / "charts" / "gpu-operator" / "values.schema.json"


class ValuesError(ValueError):
    pass


def check_values(values: dict) -> None:
    """Raise ValuesError on the first unknown key, wrong type or value out of its choices."""
    schema = json.loads(SCHEMA_FILE.read_text())
    error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(schema).iter_errors(values))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "values"
        raise ValuesError(f"{where}: {error.message}")


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
