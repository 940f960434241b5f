"""The network stack's configuration: golden renders of what gpuboot applies for the Network
Operator (tests/golden/network/<case>), the NicClusterPolicy checked against the doubles'
strict contracts (tests/doubles/network_operator: the policy's documented spec, the RDMA shared
device plugin's own config rules). The values are held to the real chart's own keys, and the
mirror plan to what NVIDIA's real operator deploys for each case, where the upstream source
trees are on the machine (test_addon_objects_dry_run.py, test_real_network_operator.py).
GPUBOOT_UPDATE_GOLDEN=1 rewrites the golden copies after a reviewed change."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.mirror.plan import Target, build
from gpuboot.phases.catalog import UP
from tests.doubles.network_operator.chart import ContractError, check_policy
from tests.support.golden import matches_golden, tree

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "network"
ADDONS = Path("etc/gpuboot/addons/network-operator")
SHARED_NETWORKS = """\
[control_plane]
cp1
[gpu_workers]
ib[1:2]
roce1
[workers:children]
gpu_workers
"""
IB_NODE = {"nics": [{"name": "ipoib", "pf_names": ["ibs1"], "link_type": "ib", "resource_name": "rdma/ib_shared",
                     "network": {"name": "ipoib", "ip_pool": {"subnet": "192.168.0.0/24", "per_node_block_size": 16}}}]}
ROCE_NODE = {"nics": [{"name": "roce", "pf_names": ["ens1f0np0"], "resource_name": "rdma/roce_shared",
                       "network": {"name": "roce", "ip_pool": {"subnet": "192.168.1.0/24", "per_node_block_size": 16}}},
                      {"name": "mgmt", "pf_names": ["eno1"], "purpose": "management"}]}


def shared_networks(root: Path) -> Path:
    """RDMA shared ports only, no VFs: IPoIB on an InfiniBand group, macvlan on a RoCE one, two architectures."""
    (root / "host_vars").mkdir(parents=True)
    (root / "group_vars").mkdir()
    (root / "group_vars" / "all.yml").write_text(yaml.safe_dump({"gpuboot": {
        "cluster_name": "shared", "release": "k8s-1.36", "control_plane": {"vip": "10.0.0.100"},
        "node_os": {"id": "ubuntu-22.04", "kernels": ["5.15.0-1048-nvidia"], "architectures": ["amd64", "arm64"]}}}))
    for name, node in (("ib1", IB_NODE), ("ib2", IB_NODE), ("roce1", ROCE_NODE)):
        (root / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump({"gpuboot_node": node}))
    (root / "hosts.ini").write_text(SHARED_NETWORKS)
    return root / "hosts.ini"


def nic_only(root: Path) -> Path:
    """The shared networks' nodes as plain workers: fabric NICs and no GPU node, so no GPU
    Operator (and none of its Node Feature Discovery) in the cluster."""
    inventory = shared_networks(root)
    inventory.write_text(SHARED_NETWORKS.replace("[gpu_workers]", "[workers]").replace(
        "[workers:children]\ngpu_workers\n", ""))
    return inventory


CASES = {
    "mixed-fleet": lambda tmp: ROOT / "tests" / "fixtures" / "mixed-fleet" / "hosts.ini",
    "sample": lambda tmp: ROOT / "inventories" / "sample" / "inventory.yml",
    "shared-networks": shared_networks,
    "nic-only": nic_only,
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each case rendered once: (inventory, the first control plane's network-operator directory)."""
    out = {}
    for case, make in CASES.items():
        inventory = make(tmp_path_factory.mktemp(f"{case}-inventory"))
        target = tmp_path_factory.mktemp(case)
        assert run(["render", str(inventory), "--phase", "network_operator", "--out", str(target)]) == 0
        first = load_cluster(inventory).first_control_plane
        out[case] = (inventory, target / first / ADDONS)
    return out


def objects(addons: Path, name: str) -> list[dict]:
    path = addons / name
    return [d for d in yaml.safe_load_all(path.read_text()) if d] if path.exists() else []


@pytest.mark.parametrize("case", ["mixed-fleet", "shared-networks"])
def test_render_matches_golden(rendered, case):
    matches_golden(rendered[case][1], GOLDEN / case)


@pytest.mark.parametrize("case", list(CASES))
def test_the_policy_fits_the_contract_and_the_bandwidth_test_s_images_are_planned(rendered, case):
    inventory, addons = rendered[case]
    check_policy(objects(addons, "nic-cluster-policy.yaml")[0]["spec"])
    cluster = load_cluster(inventory)
    release = matrix.load(cluster.settings.release)
    planned = {str(i.ref) for i in build(release, Target.of(cluster, release)).only({"network_operator"}).images}
    # The RDMA bandwidth test gpuboot writes for a person to run: its pods' images are pulled too.
    # (What the operators deploy is held to the plan by the real ones: test_real_network_operator.py.)
    bandwidth = {c["image"] for o in objects(addons, "rdma-bandwidth-test.yaml") if o["kind"] in ("Pod", "Job")
                 for c in (o["spec"] if o["kind"] == "Pod" else o["spec"]["template"]["spec"])["containers"]}
    assert bandwidth <= planned, sorted(bandwidth - planned)
    assert bool(bandwidth) is (addons / "rdma-bandwidth-test.yaml").is_file(), case


def test_the_contract_refuses_what_the_real_ones_would(rendered):
    _, addons = rendered["mixed-fleet"]
    spec = objects(addons, "nic-cluster-policy.yaml")[0]["spec"]
    with pytest.raises(ContractError, match="Additional properties"):
        check_policy({**spec, "ofedDriver": {**spec["ofedDriver"], "forcePrecompield": True}})
    twice = json.loads(spec["rdmaSharedDevicePlugin"]["config"])
    twice["configList"] *= 2
    with pytest.raises(ContractError, match="already exists"):
        check_policy({**spec, "rdmaSharedDevicePlugin": {**spec["rdmaSharedDevicePlugin"], "config": json.dumps(twice)}})


def test_one_node_feature_discovery_is_there_before_the_operator_places_its_node_operands(rendered):
    """The operator puts the DOCA driver and the device plugins only on nodes NFD labelled. With
    GPU nodes the GPU Operator's NFD serves (its phase runs first); without, this chart's."""
    order = [p.name for p in UP]
    assert order.index("gpu_operator") < order.index("network_operator"), order
    for case, own in (("nic-only", True), ("shared-networks", False), ("mixed-fleet", False)):
        inventory, addons = rendered[case]
        cluster = load_cluster(inventory)
        assert bool(cluster.in_group("gpu_workers")) is not own, case
        release = matrix.load(cluster.settings.release)
        values = yaml.safe_load((addons / "values.yaml").read_text())
        assert values["nfd"] == {"enabled": own}, case
        planned = {str(i.ref) for i in build(release, Target.of(cluster, release)).only({"network_operator"}).images}
        nfd = release.images["network_operator"]["nfd"]
        if own:
            image = values["node-feature-discovery"]["image"]
            assert f"{image['repository']}:{image['tag']}" == nfd and nfd in planned, case
        else:
            assert "node-feature-discovery" not in values and nfd not in planned, case


def test_mixed_fleet_objects(rendered):
    _, addons = rendered["mixed-fleet"]
    values = yaml.safe_load((addons / "values.yaml").read_text())
    # One NFD in the cluster (the GPU Operator's); the SR-IOV operator because groups want VFs.
    assert values["nfd"] == {"enabled": False} and values["sriovNetworkOperator"] == {"enabled": True}
    assert values["sriov-network-operator"]["operator"]["resourcePrefix"] == "nvidia.com"
    spec = objects(addons, "nic-cluster-policy.yaml")[0]["spec"]
    env = {e["name"]: e["value"] for e in spec["ofedDriver"]["env"]}
    assert env["UNLOAD_STORAGE_MODULES"] == "true"  # NVMe over RDMA on the HGX storage port
    assert spec["ofedDriver"]["forcePrecompiled"] is True and spec["ofedDriver"]["upgradePolicy"]["maxParallelUpgrades"] == 2
    sriov = {o["kind"] + "/" + o["metadata"]["name"]: o["spec"] for o in objects(addons, "sriov.yaml")}
    assert sriov["SriovNetworkPoolConfig/gpuboot-fabric"]["maxUnavailable"] == 2
    ib = sriov["SriovNetworkNodePolicy/gpuboot-ib-fabric"]
    assert ib["nodeSelector"] == {"nic.gpuboot.io/ib-fabric": "true"} and ib["linkType"] == "ib"
    assert "ens6f0np0" not in json.dumps(sriov) and "ens7f0np0" not in json.dumps(spec)  # management, storage
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects(addons, "networks.yaml")}
    assert {("SriovIBNetwork", "ib-fabric"), ("SriovNetwork", "roce"), ("IPPool", "gpuboot-roce"),
            ("Namespace", "training")} <= kinds
    labels = {o["metadata"]["name"] for o in objects(addons, "node-labels.yaml")}
    assert labels == {"hgx01", "hgx02", "hgx03", "hgx04", "l40s01", "l40s02"}  # no label on nodes without RDMA
    assert not (addons / "mirror-access.yaml").exists()  # not air-gapped


def test_shared_networks_without_vfs(rendered):
    _, addons = rendered["shared-networks"]
    assert yaml.safe_load((addons / "values.yaml").read_text())["sriovNetworkOperator"] == {"enabled": False}
    assert not (addons / "sriov.yaml").exists()
    spec = objects(addons, "nic-cluster-policy.yaml")[0]["spec"]
    config = json.loads(spec["rdmaSharedDevicePlugin"]["config"])["configList"]
    assert [(c["resourcePrefix"], c["resourceName"], c["selectors"]["ifNames"], c["selectors"]["linkTypes"])
            for c in config] == [("rdma", "ib_shared", ["ibs1"], ["infiniband"]),
                                 ("rdma", "roce_shared", ["ens1f0np0"], ["ether"])]
    assert set(spec["secondaryNetwork"]) == {"multus", "cniPlugins", "ipoib"}
    nets = {o["kind"]: o["spec"] for o in objects(addons, "networks.yaml") if o["kind"] != "IPPool"}
    assert nets["IPoIBNetwork"]["master"] == "ibs1" and nets["MacvlanNetwork"]["master"] == "ens1f0np0"
    assert json.loads(nets["IPoIBNetwork"]["ipam"]) == {"type": "nv-ipam", "poolName": "gpuboot-ipoib"}


def test_air_gap_wires_the_mirror_login_and_ca_into_the_driver_lookup(rendered):
    _, addons = rendered["sample"]
    driver = objects(addons, "nic-cluster-policy.yaml")[0]["spec"]["ofedDriver"]
    assert driver["repository"] == "mirror01.example.internal:5000/nvcr.io/nvidia/mellanox"
    assert driver["imagePullSecrets"] == ["gpuboot-mirror-pull"] and driver["certConfig"] == {"name": "gpuboot-mirror-ca"}
    # render never holds the login: a reference to its file stands in for it.
    text = (addons / "mirror-access.yaml").read_text()
    assert "<secret: a registry login read from /etc/gpuboot/secrets/mirror-credentials.json>" in text


def test_dma_buf_never_peermem(rendered):
    """No object (comments aside) loads or configures nvidia-peermem: GPUDirect goes over DMA-BUF."""
    for case, (_, addons) in rendered.items():
        loaded = [objects(addons, name) for name in tree(addons)]
        assert loaded and "peermem" not in json.dumps(loaded).lower(), case
