"""What gpuboot's gate and driver upgrade assume of NVIDIA's GPU Operator and GPU Feature
Discovery, held against their source at the versions the matrix pins (the upstream source
trees on this machine, as in test_double_schemas_vs_real_charts.py; skipped, naming the missing
tree, where absent). Each fact is one a double encodes too, so a wrong one would pass every
lab test and fail on a customer's cluster:
- the operand DaemonSets' pod labels the gate counts per GPU node (the operator's assets);
- the driver pods an NVIDIADriver object makes (their app name from getDriverAppName, their
  component label from the state-driver manifest), which the gate and the upgrade must count
  as the node's driver;
- the driver-upgrade state label, skip label and end states (k8s-operator-libs, as the operator
  vendors it, with the driver name the operator sets);
- GFD's family names for the GPU catalog's architectures."""
from __future__ import annotations

import re

import pytest
import yaml

from gpuboot import gpus, matrix
from gpuboot.gpu_plan import NodeGpu
from tests.integration.test_double_schemas_vs_real_charts import git, releases_of, show, source_tree
from tests.support.modules import load_module

pytestmark = pytest.mark.slow


def device_plugin_versions() -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for name in matrix.available():
        image = matrix.load(name).images.get("gpu_operator", {}).get("devicePlugin", "")
        if image:
            seen.setdefault(image.rsplit(":", 1)[1], name)
    return sorted(seen.items())


# (version, first release pinning it) of the GPU Operator chart, as the schema test lists them.
GPU_OPERATOR = releases_of("gpu-operator")


def every_operand_app() -> set[str]:
    """Every operand the gate may demand of a GPU node: a built driver and a MIG configuration."""
    return set(NodeGpu("g", None, 8, "container", None, None, (), "all-1g.10gb").operand_apps())


def asset_apps(git_dir, tag: str) -> dict[str, str]:
    """app label of each DaemonSet's pods in the operator's assets at the tag -> the file."""
    listed = git(git_dir, "ls-tree", "-r", "--name-only", tag, "assets").stdout.split()
    apps = {}
    for path in (p for p in listed if p.endswith((".yaml", ".yml"))):
        try:
            docs = list(yaml.safe_load_all(show(git_dir, tag, path) or ""))
        except yaml.YAMLError:
            continue
        for doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "DaemonSet":
                app = ((doc["spec"]["template"].get("metadata") or {}).get("labels") or {}).get("app")
                if app:
                    apps[app] = path
    return apps


@pytest.mark.parametrize(("version", "release"), GPU_OPERATOR, ids=[v for v, _ in GPU_OPERATOR])
def test_the_operands_the_gate_counts_are_the_operators_daemonsets(version, release):
    _, git_dir, tag = source_tree("gpu-operator", version, release)
    apps = asset_apps(git_dir, tag)
    assert len(apps) >= 8, f"{tag}: the operator's DaemonSets did not read: {sorted(apps)}"
    missing = sorted(every_operand_app() - apps.keys())
    assert not missing, f"the gate counts pods labelled app={missing}, which no DaemonSet of {tag}'s assets runs"


@pytest.mark.parametrize(("version", "release"), GPU_OPERATOR, ids=[v for v, _ in GPU_OPERATOR])
def test_an_nvidia_driver_objects_pods_count_as_the_nodes_driver(version, release):
    _, git_dir, tag = source_tree("gpu-operator", version, release)
    code = show(git_dir, tag, "internal/state/driver.go") or ""
    prefix = re.search(r'appNamePrefixFormat\s*=\s*"([^"]+)"', code)
    assert prefix, f"{tag}: getDriverAppName's format not found in internal/state/driver.go"
    manifest = show(git_dir, tag, "manifests/state-driver/0500_daemonset.yaml") or ""
    template = manifest[manifest.index("template:"):]
    assert "app: {{ .Driver.AppName }}" in template and 'app.kubernetes.io/component: "nvidia-driver"' in template
    kube = load_module("gpuboot_cluster_check")
    # driverType gpu on Ubuntu 22.04, with the hash the operator appends.
    app = prefix.group(1) % ("gpu", "ubuntu22.04") + "-7c6d7bd86b"
    pod = {"metadata": {"name": f"{app}-x2k4q", "labels": {"app": app, "app.kubernetes.io/component": "nvidia-driver"}}}
    assert kube.operand_of(pod) == "nvidia-driver-daemonset"
    # And the ClusterPolicy's own driver pods.
    assert kube.operand_of({"metadata": {"name": "d", "labels": {"app": "nvidia-driver-daemonset"}}}) == \
        "nvidia-driver-daemonset"


@pytest.mark.parametrize(("version", "release"), GPU_OPERATOR, ids=[v for v, _ in GPU_OPERATOR])
def test_the_driver_upgrade_states_gpuboot_follows_are_the_operators(version, release):
    _, git_dir, tag = source_tree("gpu-operator", version, release)
    consts = show(git_dir, tag, "vendor/github.com/NVIDIA/k8s-operator-libs/pkg/upgrade/consts.go") or ""
    main = show(git_dir, tag, "cmd/gpu-operator/main.go") or ""
    driver = re.search(r'upgrade\.SetDriverName\("([^"]+)"\)', main)
    assert consts and driver, f"{tag}: k8s-operator-libs' upgrade constants or the operator's driver name not found"

    def const(name: str) -> str:
        found = re.search(rf'\b{name}\s*=\s*"([^"]*)"', consts)
        assert found, f"{tag}: {name} not in k8s-operator-libs"
        return found.group(1)

    upgrade = load_module("gpuboot_driver_upgrade")
    assert upgrade.STATE_LABEL == const("UpgradeStateLabelKeyFmt") % driver.group(1)
    assert upgrade.SKIP_LABEL == const("UpgradeSkipNodeLabelKeyFmt") % driver.group(1)
    assert (upgrade.DONE, upgrade.FAILED) == (const("UpgradeStateDone"), const("UpgradeStateFailed"))


@pytest.mark.parametrize(("version", "release"), device_plugin_versions(), ids=[v for v, _ in device_plugin_versions()])
def test_gfd_names_the_catalogs_architectures_as_the_gate_expects(version, release):
    from tests.integration.test_double_schemas_vs_real_charts import SOURCES
    git_dir = SOURCES / "NVIDIA+k8s-device-plugin" / "repo"
    if not git_dir.is_dir():
        pytest.skip(f"NVIDIA/k8s-device-plugin's source tree is not on this machine ({git_dir})")
    code = show(git_dir, version, "internal/lm/resource.go")
    assert code, f"{release} pins the device plugin {version}, but its tree has no internal/lm/resource.go there"
    body = code[code.index("func getArchFamily"):]
    families = set(re.findall(r'return "([a-z-]+)"', body[:body.index("\n}\n")]))
    wanted = {model.gfd_family for model in gpus.catalog().values()}
    assert wanted <= families, f"GFD {version} names no family {sorted(wanted - families)} (it knows {sorted(families)})"
    # The labels are nvidia.com/gpu.<key>: the resource labeler's keys.
    for key in ("family", "product", "count"):
        assert re.search(rf'"{key}":\s', code), f"GFD {version} sets no nvidia.com/gpu.{key}"
