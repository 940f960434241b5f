"""The GPU stack's configuration per feature: golden renders of what gpuboot applies for the
GPU Operator and Calico (tests/golden/gpu/<case>) and the facts of its values. The values are
held to the real chart's own keys, and the mirror plan to what NVIDIA's real operator deploys
for each case, where the upstream source trees are on the machine (test_addon_objects_dry_run.py,
test_real_gpu_operator.py). GPUBOOT_UPDATE_GOLDEN=1 rewrites the golden copies after a reviewed
change."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.mirror.plan import Target, build
from tests.support.golden import matches_golden

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted(p.name for p in (ROOT / "tests" / "corpus" / "gpu").iterdir() if p.is_dir())
GOLDEN = ROOT / "tests" / "golden" / "gpu"
ADDONS = Path("etc/gpuboot/addons")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each case rendered once: (inventory, the first control plane's addons directory)."""
    out = {}
    for case in CASES:
        inventory = ROOT / "tests" / "corpus" / "gpu" / case / "inventory.yml"
        target = tmp_path_factory.mktemp(case)
        assert run(["render", str(inventory), "--out", str(target)]) == 0
        out[case] = (inventory, target / "cp1" / ADDONS)
    return out


def load(addons: Path, name: str):
    return yaml.safe_load((addons / name).read_text())


def node_labels(addons: Path) -> dict[str, dict]:
    """node name -> the labels gpuboot applies (node-labels.yaml: Node objects, applied server-side)."""
    nodes = [d for d in yaml.safe_load_all((addons / "gpu-operator" / "node-labels.yaml").read_text()) if d]
    assert all(d["apiVersion"] == "v1" and d["kind"] == "Node" and set(d["metadata"]) == {"name", "labels"}
               for d in nodes), nodes
    return {d["metadata"]["name"]: d["metadata"]["labels"] for d in nodes}


@pytest.mark.parametrize("case", CASES)
def test_render_matches_golden(rendered, case):
    matches_golden(rendered[case][1], GOLDEN / case)


def test_open_modules_and_dma_buf_never_peermem(rendered):
    for case in CASES:
        text = (rendered[case][1] / "gpu-operator" / "values.yaml").read_text()
        values = yaml.safe_load(text)
        assert "useOpenKernelModules" not in text, case
        assert not (values["driver"].get("rdma") or {}).get("enabled"), case
        if values["driver"]["enabled"]:
            assert values["driver"]["kernelModuleType"] == "open", case
        # containerd is never the toolkit's to rewrite: an NRI plugin where the versions allow it,
        # else a drop-in that containerd's config.toml imports, never config.toml itself.
        release = matrix.load(load_cluster(rendered[case][0]).settings.release)
        if cdi_through_nri(release):
            assert values["cdi"] == {"enabled": True, "nriPluginEnabled": True}, case
            assert "env" not in values["toolkit"], case
        else:
            assert not values["cdi"].get("nriPluginEnabled"), case
            env = {e["name"]: e["value"] for e in values["toolkit"]["env"]}
            assert env["CONTAINERD_CONFIG"] == "/etc/containerd/conf.d/99-nvidia.toml", case


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.lstrip("v").split("-")[0].split("~")[0].split(".")[:3])


def cdi_through_nri(release: matrix.Release) -> bool:
    """What the GPU Operator's docs ask for the toolkit as an NRI plugin: operator 26.3+ and a
    containerd with CDI through NRI (2.1+, or 1.7.30+ on 1.7)."""
    containerd = _version(release.containerd.version)
    operator = _version(release.model_extra["gpu_operator"]["version"])
    return operator >= (26, 3) and (containerd >= (2, 1) or (1, 7, 30) <= containerd < (2, 0))


@pytest.mark.parametrize("name", matrix.available())
def test_every_os_of_a_release_runs_containerd_that_the_cdi_choice_holds_for(name):
    """The choice is made once per cluster from the release's containerd: each OS's package
    must be that containerd (config version 3 from containerd 2 on)."""
    release = matrix.load(name)
    for os_id, packages in release.os.items():
        version = str(packages.containerd["version"])
        if cdi_through_nri(release):
            assert _version(version)[:2] == _version(release.containerd.version)[:2], (name, os_id, version)
            assert packages.containerd["config_version"] == 3, (name, os_id)


def test_time_slicing_profiles_per_node_group(rendered):
    addons = rendered["time_slicing"][1]
    profiles = yaml.safe_load(load(addons, "gpu-operator/device-plugin-config.yaml")["data"]["time-sliced-8"])
    assert profiles["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 8}]
    labels = node_labels(addons)
    assert {n: lb["nvidia.com/device-plugin.config"] for n, lb in labels.items()} == {
        "l40s-01": "time-sliced-4", "l40s-02": "time-sliced-4", "l40s-03": "time-sliced-8"}
    # L40S has no MIG: no layout label, no MIG manager config.
    assert not any("nvidia.com/mig.config" in lb for lb in labels.values())
    assert not (addons / "gpu-operator" / "mig-parted-config.yaml").exists()
    cluster = load_cluster(rendered["time_slicing"][0])
    assert cluster.gpu_plan.nodes["l40s-03"].resources("mixed") == {"nvidia.com/gpu": 32}


def test_mig_mixed_layouts(rendered):
    addons = rendered["mig_mixed"][1]
    values = load(addons, "gpu-operator/values.yaml")
    assert values["mig"]["strategy"] == "mixed" and values["migManager"]["config"]["name"] == "gpuboot-mig-parted-config"
    configs = yaml.safe_load(load(addons, "gpu-operator/mig-parted-config.yaml")["data"]["config.yaml"])["mig-configs"]
    # all-balanced differs per model: one entry per model, each filtered to its PCI id.
    assert configs["all-balanced"] == [
        {"devices": "all", "device-filter": ["0x233010DE"], "mig-enabled": True,
         "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
        {"devices": "all", "device-filter": ["0x20b010DE"], "mig-enabled": True,
         "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}}]
    assert configs["inference"][1]["mig-devices"] == {"1g.10gb": 7}
    plan = load_cluster(rendered["mig_mixed"][0]).gpu_plan
    assert plan.nodes["h100-01"].resources("mixed") == {
        "nvidia.com/mig-1g.10gb": 14, "nvidia.com/mig-2g.20gb": 4, "nvidia.com/mig-3g.40gb": 2, "nvidia.com/gpu": 4}
    assert plan.nodes["h100-02"].resources("mixed") == {"nvidia.com/mig-3g.40gb": 8, "nvidia.com/mig-1g.10gb": 28}


def test_precompiled_images_per_node_kernel(rendered):
    inventory, addons = rendered["precompiled_per_kernel"]
    values = load(addons, "gpu-operator/values.yaml")
    assert values["driver"]["usePrecompiled"] is True and values["driver"]["version"] == "580"
    cluster = load_cluster(inventory)
    release = matrix.load(cluster.settings.release)
    drivers = sorted(str(i.ref) for i in build(release, Target.of(cluster, release)).images if "/driver:" in str(i.ref))
    assert drivers == ["nvcr.io/nvidia/driver:580-5.15.0-1032-nvidia-ubuntu22.04",
                       "nvcr.io/nvidia/driver:580-5.15.0-1048-nvidia-ubuntu22.04",
                       "nvcr.io/nvidia/driver:580-6.8.0-1013-nvidia-ubuntu24.04"]


def test_preinstalled_drivers_deploy_none(rendered):
    addons = rendered["preinstalled"][1]
    assert load(addons, "gpu-operator/values.yaml")["driver"] == {"enabled": False}
    labels = node_labels(addons)
    assert all(lb["nvidia.com/gpu.deploy.driver"] == "false" for lb in labels.values())


def test_mixed_driver_kinds_get_one_nvidiadriver_each(rendered):
    addons = rendered["mixed_drivers"][1]
    values = load(addons, "gpu-operator/values.yaml")
    assert values["driver"]["nvidiaDriverCRD"] == {"enabled": True, "deployDefaultCR": False}
    drivers = [d for d in yaml.safe_load_all((addons / "gpu-operator" / "nvidia-drivers.yaml").read_text()) if d]
    assert [(d["metadata"]["name"], d["spec"]["usePrecompiled"], d["spec"]["version"]) for d in drivers] == [
        ("gpuboot-container", False, "580.178.04"), ("gpuboot-precompiled", True, "580")]
    labels = node_labels(addons)
    assert labels["h100-02"]["gpuboot.io/gpu-driver"] == "container"
    assert labels["dgx-01"] == {"nvidia.com/device-plugin.config": "default", "nvidia.com/gpu.deploy.driver": "false",
                                "nvidia.com/mig.config": "all-disabled"}


def test_calico_installation_from_the_inventory(rendered):
    values = load(rendered["rdma_present"][1], "calico/values.yaml")
    network = values["installation"]["calicoNetwork"]
    assert network["ipPools"][0]["cidr"] == "10.244.0.0/16"
    assert network["nodeAddressAutodetectionV4"] == {"kubernetes": "NodeInternalIP"}
    # Registry and path set in full, from the matrix's images (a partial override pulls upstream).
    release = matrix.load("k8s-1.36")
    node_image = next(i for i in release.images["calico"] if "/node:" in i)
    assert node_image.startswith(values["installation"]["registry"] + values["installation"]["imagePath"] + "/")
    operator = values["tigeraOperator"]
    assert f"{operator['registry']}/{operator['image']}:{operator['version']}" in release.images["calico"]


def test_dev_char_links_off_reach_the_validator_s_driver_env(tmp_path):
    """gpu_operator.dev_char_symlinks: false is NVIDIA's documented switch, in the chart's
    validator.driver.env; left at its default the validator links /dev/char as upstream does."""
    data = yaml.safe_load((ROOT / "tests" / "corpus" / "gpu" / "preinstalled" / "inventory.yml").read_text())
    data["all"]["vars"]["gpuboot"]["gpu_operator"] = {"dev_char_symlinks": False}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    assert run(["render", str(inventory), "--out", str(tmp_path / "out")]) == 0
    values = load(tmp_path / "out" / "cp1" / ADDONS, "gpu-operator/values.yaml")
    assert values["validator"]["driver"] == {"env": [{"name": "DISABLE_DEV_CHAR_SYMLINK_CREATION", "value": "true"}]}


def test_dev_char_links_stay_on_by_default(rendered):
    values = load(rendered["preinstalled"][1], "gpu-operator/values.yaml")
    assert "driver" not in values["validator"]


def test_the_fleet_s_upgrade_policy_reaches_each_nvidiadriver(tmp_path):
    """NVIDIA's upgrade controller takes a mixed-driver node's policy from its NVIDIADriver's own
    spec.upgradePolicy, never the ClusterPolicy's (v26.7.0: reconcileNVIDIADriverUpgrades and
    NVIDIADriverSpec.GetUpgradePolicyWithDefaults; absent, it upgrades one node at a time, 25 %
    unavailable). Seen against the real controller in test_real_gpu_operator_pods.py."""
    data = yaml.safe_load((ROOT / "tests" / "corpus" / "gpu" / "mixed_drivers" / "inventory.yml").read_text())
    data["all"]["vars"]["gpuboot"]["gpu_operator"] = {"upgrade_max_parallel": 3, "upgrade_max_unavailable": "2"}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    assert run(["render", str(inventory), "--out", str(tmp_path / "out")]) == 0
    addons = tmp_path / "out" / "cp1" / ADDONS
    assert load(addons, "gpu-operator/values.yaml")["driver"]["upgradePolicy"]["maxParallelUpgrades"] == 3
    drivers = [d for d in yaml.safe_load_all((addons / "gpu-operator" / "nvidia-drivers.yaml").read_text()) if d]
    assert len(drivers) >= 2
    for found in drivers:
        assert found["spec"]["upgradePolicy"] == {"autoUpgrade": True, "maxParallelUpgrades": 3,
                                                  "maxUnavailable": "2"}, found["metadata"]["name"]
    # An operator whose NVIDIADriver CRD has no upgradePolicy (before v26.7.0) gets none: its
    # server-side apply would refuse the field.
    data["all"]["vars"]["gpuboot"]["release"] = "k8s-1.35"
    inventory.write_text(yaml.safe_dump(data))
    assert run(["render", str(inventory), "--out", str(tmp_path / "older")]) == 0
    older = [d for d in yaml.safe_load_all((tmp_path / "older" / "cp1" / ADDONS / "gpu-operator" /
                                            "nvidia-drivers.yaml").read_text()) if d]
    assert older and all("upgradePolicy" not in d["spec"] for d in older)
