"""What each GPU node gets from the GPU Operator: layouts, profiles, labels and the
resources it must advertise, resolved from inventories written per node and per group."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from gpuboot import gpus
from gpuboot.config.loader import load_cluster
from gpuboot.errors import InventoryError
from gpuboot.gpu_plan import DRIVER_KIND_LABEL

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "inventories" / "sample" / "inventory.yml"

SETTINGS = """\
gpuboot:
  cluster_name: lab
  release: k8s-1.36
  control_plane: {vip: 10.0.0.100}
  node_os: {id: ubuntu-22.04, kernels: [5.15.0-1048-nvidia]}
  drivers: {precompiled: true}
"""


def hosts_ini(gpu_groups: str) -> str:
    """An INI inventory: one control plane, the GPU groups given, every GPU worker a worker."""
    return f"[control_plane]\ncp1 ansible_host=10.0.0.11\n{textwrap.dedent(gpu_groups)}[workers:children]\ngpu_workers\n"


def inventory(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / "hosts.ini"


def test_sample_resolves_mixed_mig_and_time_slicing():
    plan = load_cluster(SAMPLE).gpu_plan
    mig, shared = plan.nodes["gpu01"], plan.nodes["gpu02"]
    assert mig.resources("mixed") == {"nvidia.com/mig-1g.18gb": 28, "nvidia.com/gpu": 4}
    assert shared.resources("mixed") == {"nvidia.com/gpu": 32}
    assert mig.labels(False)["nvidia.com/mig.config"].startswith("gpuboot-")
    assert shared.labels(False) == {"nvidia.com/device-plugin.config": "time-sliced-4",
                                    "nvidia.com/mig.config": "all-disabled"}
    entries = plan.mig_configs[mig.mig_config]
    assert entries == [
        {"devices": [0, 1, 2, 3], "device-filter": ["0x233510DE"], "mig-enabled": True, "mig-devices": {"1g.18gb": 7}},
        {"devices": [4, 5, 6, 7], "device-filter": ["0x233510DE"], "mig-enabled": False}]
    assert plan.device_plugin_configs()["time-sliced-4"]["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}]
    assert plan.driver_kinds == ["precompiled"] and not plan.mixed_drivers


def test_group_vars_layouts_single_strategy_and_mixed_driver_kinds(tmp_path):
    path = inventory(tmp_path, {
        "hosts.ini": hosts_ini("""\
            [a100]
            a100-[01:02]
            [dgx]
            dgx01 ansible_host=10.0.1.40
            [gpu_workers:children]
            a100
            dgx
            """),
        "group_vars/all.yml": SETTINGS + "  gpu_operator:\n    mig_strategy: single\n",
        "group_vars/a100.yml": """\
            gpuboot_node:
              kernel: 5.15.0-127-generic
              gpu: {model: A100-SXM4-40GB, count: 8, driver: container, mig: {layout: all-3g.20gb}}
            """,
        "host_vars/dgx01.yml": """\
            gpuboot_node:
              gpu: {model: H100-SXM5-80GB, count: 8, driver: preinstalled}
            """})
    cluster = load_cluster(path)
    plan = cluster.gpu_plan
    a100 = plan.nodes["a100-01"]
    # single: every MIG device is an nvidia.com/gpu; 2 x 3g.20gb per GPU.
    assert a100.resources("single") == {"nvidia.com/gpu": 16}
    assert a100.mig_config == "all-3g.20gb"
    assert plan.mig_configs["all-3g.20gb"] == [
        {"devices": "all", "device-filter": ["0x20b010DE"], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}]
    assert plan.nodes["dgx01"].labels(plan.mixed_drivers)["nvidia.com/gpu.deploy.driver"] == "false"
    # container on the A100s, precompiled is the cluster default but nobody else uses it.
    assert plan.driver_kinds == ["container"]
    assert plan.device_plugin_configs()["default"]["flags"] == {"migStrategy": "single"}


def test_mixed_driver_kinds_label_each_node_with_its_kind(tmp_path):
    path = inventory(tmp_path, {
        "hosts.ini": hosts_ini("[gpu_workers]\ng1 ansible_host=10.0.1.1\ng2 ansible_host=10.0.1.2\n"),
        "group_vars/all.yml": SETTINGS,
        "host_vars/g2.yml": "gpuboot_node: {gpu: {driver: container}}\n"})
    plan = load_cluster(path).gpu_plan
    assert plan.mixed_drivers and plan.driver_kinds == ["container", "precompiled"]
    assert plan.nodes["g1"].labels(True)["gpuboot.io/gpu-driver"] == "precompiled"
    assert plan.nodes["g2"].labels(True)["gpuboot.io/gpu-driver"] == "container"


@pytest.mark.parametrize("gpu, message, path", [
    ("{model: L40S-48GB, mig: {layout: all-balanced}}", "L40S-48GB has no MIG", "gpu.mig"),
    ("{model: A30-24GB, mig: {devices: [{gpus: all, instances: {2g.12gb: 2, 1g.6gb: 1}}]}}",
     "needs 5 compute and 5 memory slices; one GPU has 4 and 4", "gpu.mig.devices[0].instances"),
    ("{model: H100-SXM5-80GB, count: 2, mig: {devices: [{gpus: [0], instances: {1g.10gb: 7}}]}}",
     "GPU 1 of 2 is in no entry", "gpu.mig.devices"),
    ("{model: H100-SXM5-80GB, mig: {devices: [{gpus: [0, 1]}, {gpus: [1], instances: {7g.80gb: 1}}]}}",
     "GPU 1 is also in entry 0", "gpu.mig.devices[1].gpus"),
    ("{model: H100-SXM5-80GB, mig: {layout: research}}", "MIG layout research does not exist", "gpu.mig.layout"),
])
def test_impossible_gpu_settings_on_a_group_are_located(tmp_path, gpu, message, path):
    inv = inventory(tmp_path, {
        "hosts.ini": hosts_ini("[gpu_workers]\ng[1:2]\n"),
        "group_vars/all.yml": SETTINGS,
        "group_vars/gpu_workers.yml": f"# GPU floor\ngpuboot_node:\n  gpu: {gpu}\n"})
    with pytest.raises(InventoryError) as info:
        load_cluster(inv)
    found = [p for p in info.value.problems if message in p.message]
    assert {p.path for p in found} == {f"g1.gpuboot_node.{path}", f"g2.gpuboot_node.{path}"}, info.value
    assert all(p.file.endswith("gpu_workers.yml") and p.line == 3 and p.fix for p in found)


def test_every_mig_model_has_a_balanced_layout_that_fits():
    for model in gpus.catalog().values():
        if model.mig is not None:
            assert model.mig.misfit(model.mig.balanced) is None, model.name
            for profile in model.mig.profiles.values():
                assert model.mig.misfit({profile.name: profile.most}) is None, (model.name, profile.name)


def test_gfd_labels_the_gate_expects_follow_model_sharing_and_mig(tmp_path):
    """What GPU Feature Discovery must have labelled (its names as a real H200 showed them,
    tests/gpu/fixtures): the family always; product and count for whole GPUs; -SHARED when
    time-sliced; nothing GFD renames under MIG; Ada's family is GFD's ada-lovelace."""
    path = inventory(tmp_path, {
        "hosts.ini": hosts_ini("""\
            [gpu_workers]
            h200-[1:3]
            l40s1
            odd1
            """),
        "group_vars/all.yml": SETTINGS,
        "host_vars/h200-1.yml": "gpuboot_node:\n  gpu: {model: H200-SXM-141GB, count: 8}\n",
        "host_vars/h200-2.yml": "gpuboot_node:\n  gpu: {model: H200-SXM-141GB, count: 8, time_slicing_replicas: 4}\n",
        "host_vars/h200-3.yml": "gpuboot_node:\n  gpu: {model: H200-SXM-141GB, count: 8, mig: {layout: all-1g.18gb}}\n",
        "host_vars/l40s1.yml": "gpuboot_node:\n  gpu: {model: L40S-48GB, count: 2}\n",
        "host_vars/odd1.yml": "gpuboot_node:\n  gpu: {count: 1}\n"})
    nodes = load_cluster(path).gpu_plan.nodes
    assert nodes["h200-1"].gfd_labels() == {"nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.product": "NVIDIA-H200",
                                            "nvidia.com/gpu.count": "8"}
    assert nodes["h200-2"].gfd_labels()["nvidia.com/gpu.product"] == "NVIDIA-H200-SHARED"
    assert nodes["h200-3"].gfd_labels() == {"nvidia.com/gpu.family": "hopper"}
    # No GFD name recorded for the L40S: its product is not checked, its family and count are.
    assert nodes["l40s1"].gfd_labels() == {"nvidia.com/gpu.family": "ada-lovelace", "nvidia.com/gpu.count": "2"}
    assert nodes["odd1"].gfd_labels() == {}


def test_every_recorded_gfd_product_is_nvml_naming():
    """GFD's product is NVML's name with spaces as dashes: never spaces, always NVIDIA's prefix."""
    recorded = {name: model.gfd_product for name, model in gpus.catalog().items() if model.gfd_product}
    assert recorded["H200-SXM-141GB"] == "NVIDIA-H200" and recorded["H100-SXM5-80GB"] == "NVIDIA-H100-80GB-HBM3"
    for product in recorded.values():
        assert product.startswith("NVIDIA-") and " " not in product


def test_a_node_without_a_declared_count_leaves_the_count_to_discovery(tmp_path):
    hosts = inventory(tmp_path, {
        "hosts.ini": "[control_plane]\ncp1 ansible_host=10.0.0.1\n\n[gpu_workers]\nl40s ansible_host=10.0.0.2\n"
                     "plain ansible_host=10.0.0.3\ncounted ansible_host=10.0.0.4\n\n[workers:children]\ngpu_workers\n",
        "group_vars/all.yml": SETTINGS,
        "host_vars/l40s.yml": "gpuboot_node: {gpu: {model: L40S-48GB, time_slicing_replicas: 4}}\n",
        "host_vars/plain.yml": "gpuboot_node: {gpu: {model: L40S-48GB}}\n",
        "host_vars/counted.yml": "gpuboot_node: {gpu: {model: L40S-48GB, count: 2}}\n"})
    plan = load_cluster(hosts).gpu_plan
    data = plan.as_data()["nodes"]
    # Validation multiplies what each GPU yields by the GPUs preflight's discovery finds.
    assert data["l40s"]["resources"] is None and data["l40s"]["per_gpu"] == {"nvidia.com/gpu": 4}
    assert data["plain"]["per_gpu"] == {"nvidia.com/gpu": 1}
    assert data["counted"]["per_gpu"] is None and data["counted"]["resources"] == {"nvidia.com/gpu": 2}
    assert plan.offered() is None  # the tenants' quotas cannot be held against an unknown count


def test_nodes_of_two_os_releases_take_nvidiadriver_objects_even_of_one_kind(tmp_path):
    """NVIDIA's ClusterPolicy gives every node the OS tag of the first GPU node it lists (found by
    the real operator in the lab: a 22.04 node's precompiled DaemonSet named a 24.04 image), so a
    fleet of two OS releases needs the NVIDIADriver objects, which pool nodes by OS and kernel.
    A node on the host's own driver does not count: the operator deploys it none."""
    two_os = load_cluster(ROOT / "tests" / "corpus" / "gpu" / "precompiled_per_kernel" / "inventory.yml").gpu_plan
    assert two_os.driver_kinds == ["precompiled"] and two_os.mixed_drivers
    assert {n.labels(True).get(DRIVER_KIND_LABEL) for n in two_os.nodes.values()} == {"precompiled"}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"gpuboot": {"cluster_name": "c", "release": "k8s-1.36", "control_plane": {"vip": "10.0.0.10"},
                             "node_os": {"id": "ubuntu-22.04", "kernels": ["5.15.0-1048-nvidia"]}}},
        "children": {"control_plane": {"hosts": {"cp1": None}},
                     "workers": {"children": {"gpu_workers": {"hosts": {
                         "g1": {"gpuboot_node": {"gpu": {"model": "H100-SXM5-80GB", "count": 8}}},
                         "g2": {"gpuboot_node": {"os": "ubuntu-24.04", "kernel": "6.8.0-1021-nvidia",
                                                 "gpu": {"model": "H100-SXM5-80GB", "count": 8,
                                                         "driver": "preinstalled"}}}}}}}}}}))
    one_os = load_cluster(path).gpu_plan
    assert one_os.driver_kinds == ["container"] and not one_os.mixed_drivers
    assert DRIVER_KIND_LABEL not in one_os.nodes["g1"].labels(one_os.mixed_drivers)
