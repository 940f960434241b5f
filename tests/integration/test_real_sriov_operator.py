"""NVIDIA's SR-IOV Network Operator reconciles gpuboot's SR-IOV objects on a real API server
(issue 29, points 3 and 4).

The controller is built from NVIDIA's fork (Mellanox/sriov-network-operator), the source of the
image the Network Operator's chart pins (`sriov-network-operator:network-operator-vX`). The
fork's tree on this machine may lack that tag: it is then built from the fork's release branch
for that version (`network-operator-X.Y.x`) at its newest stored commit, and the test says so.
One of its dependencies (`k8snetworkplumbingwg/dra-driver-sriov`, a pseudo-version) is refused
by the Go module proxy: it is built from that repository's source tree at the commit its
pseudo-version names. Run as the real chart's Deployment runs it (its environment, its
SriovOperatorConfig and ConfigMaps), against the CRDs of the chart, fed gpuboot's rendered
SriovNetworkPoolConfig, SriovNetworkNodePolicies, networks and node labels.

TEST DOUBLE (here, `config_daemon_double`): the SR-IOV config daemon's report of each node's
NICs (SriovNetworkNodeState status), which needs a ConnectX NIC. It reports the ports each
inventory declares, with the PCI identity a ConnectX-7 has, and a port outside every fabric
group that no policy may take.

What the operator then does is held against gpuboot:
- it makes a node state for every fabric node and for no other node;
- each node's spec gets every declared port of its SR-IOV groups, with the group's VF count,
  link type, device type and resource, and nothing else;
- the device plugin's configuration names each group's resource with the group's selectors;
- every image it deploys (config daemon, device plugin, the CNI plugins their init containers
  copy) is in the mirror plan, and every SR-IOV image of the plan it deploys is deployed;
- each SriovNetwork/SriovIBNetwork becomes a NetworkAttachmentDefinition in the pods'
  namespace, asking for the group's resource, with gpuboot's nv-ipam pool.
No kubelet runs here: the pods, the VFs and their traffic are the lab's (with doubles) and a
real NIC's."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from gpuboot.mirror.plan import Target, build
from gpuboot.mirror.refs import parse_image
from gpuboot_lab.operators import SRIOV_OPERATOR, OperatorBuild
from gpuboot_lab.upstream import SOURCE_ROOT, source_git_dir
from tests.integration import test_real_gpu_operator
from tests.integration.test_addon_objects_dry_run import render_through_real_chart
from tests.integration.test_real_network_operator import CASES, MOFED_WAIT, chart_env, controller
from tests.support.apiserver import ApiServer

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SPEC = SRIOV_OPERATOR
FORK = SPEC.origin
# A ConnectX-7 as sysfs shows it (the double's ports), and its VFs' device id.
CX7 = {"vendor": "15b3", "deviceID": "1021", "driver": "mlx5_core", "totalvfs": 16}
# Ports outside every group: ConnectX-6 Dx, else ConnectX-5, whichever no group selects.
OTHER_DEVICES = ("101d", "1017")
NAD_CRD = "deployment/sriov-network-operator-chart/crds/k8s.cni.cncf.io_networkattachmentdefinitions_crd.yaml"
# Each step takes seconds alone; a CI lane beside a cluster lab can make it a minute.
SETTLE_S = 150
KINDS = ("sriovnetworknodepolicies,sriovnetworknodestates,sriovnetworkpoolconfigs,sriovnetworks,"
         "sriovibnetworks,sriovoperatorconfigs,nodes")
SRIOV_IMAGES = ("sriovConfigDaemon", "sriovDevicePlugin", "sriovCni", "ibSriovCni", "rdmaCni")

api = test_real_gpu_operator.api


def fork_ref(chart_tag: str) -> tuple[str, str]:
    """(git revision to build, what it is): the chart's tag where the fork's tree has it, else the
    newest stored commit of the release branch for that version (OperatorBuild.revision)."""
    if source_git_dir(FORK) is None:
        pytest.skip(f"{FORK}'s source tree is not on this machine: git clone --bare https://github.com/{FORK} "
                    f"{SOURCE_ROOT}/{FORK.replace('/', '+')}/repo")
    return OperatorBuild(log=print).revision(SPEC, chart_tag)


@pytest.fixture(scope="module")
def operator(tmp_path_factory):
    """By the chart's image tag: (binary, the image's root holding bindata/ and the
    NetworkAttachmentDefinition CRD, what was built)."""
    built: dict[str, tuple[Path, Path, str]] = {}

    def for_tag(chart_tag: str) -> tuple[Path, Path, str]:
        if chart_tag not in built:
            ref, what = fork_ref(chart_tag)
            print(f"the SR-IOV operator for {chart_tag}: {what}")
            root = tmp_path_factory.mktemp("sriov-operator-image")
            for _, repository, _ in SPEC.from_trees:
                if source_git_dir(repository) is None:
                    pytest.skip(f"{repository}'s source tree is not on this machine (the module proxy refuses the "
                                f"module): git clone --bare https://github.com/{repository} "
                                f"{SOURCE_ROOT}/{repository.replace('/', '+')}/repo")
            builder = OperatorBuild(log=print)
            binary = builder.build(SPEC, ref) / "sriov-network-operator"
            for path, data, mode in builder.files(SPEC, ref):
                target = root / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                target.chmod(mode)
            # Multus' CRD (the Network Operator deploys Multus), as the fork's tree carries it.
            (root / "nad-crd.yaml").write_bytes(subprocess.run(
                ["git", f"--git-dir={source_git_dir(FORK)}", "show", f"{ref}:{NAD_CRD}"], capture_output=True,
                check=True).stdout)
            built[chart_tag] = binary, root, what
        return built[chart_tag]

    return for_tag


def declared_ports(cluster, node: str) -> list[dict]:
    """The node's NIC ports as the inventory declares them (name, PCI address, device id)."""
    ports = []
    for nic in cluster.nic_plan.nodes.get(node, ()):
        count = max(len(nic.pf_names), len(nic.pci_addresses), 1 if nic.device_ids else 0)
        for index in range(count):
            ports.append({"group": nic.name if nic.kind else None, "link_type": nic.link_type,
                          "name": nic.pf_names[index] if index < len(nic.pf_names) else None,
                          "pci": nic.pci_addresses[index] if index < len(nic.pci_addresses) else None,
                          "device_id": nic.device_ids[0].split(":", 1)[1] if nic.device_ids else None})
    return ports


def config_daemon_double(cluster, node: str) -> list[dict]:
    """TEST DOUBLE of the config daemon's report: status.interfaces of a node whose NICs are the
    ones the inventory declares, as preflight passed them: a group's ports are ConnectX-7s (or
    the device the group names), every other port (management, storage, one no group declares)
    a ConnectX-6 Dx that no group's device-id selector takes (preflight stops a run where one
    would)."""
    ports = declared_ports(cluster, node)
    taken = {p["device_id"] for p in ports if p["group"]}
    other = next(d for d in OTHER_DEVICES if d not in taken)
    interfaces = []
    for index, port in enumerate([*ports, {"group": None, "link_type": "eth", "name": None, "pci": None,
                                           "device_id": None}]):
        device = (port["device_id"] or CX7["deviceID"]) if port["group"] else other
        interfaces.append({
            "name": port["name"] or f"ens{200 + index}f0np0",
            "pciAddress": port["pci"] or f"0000:{0xa0 + index:02x}:00.0",
            "vendor": CX7["vendor"], "deviceID": device, "driver": CX7["driver"],
            "totalvfs": CX7["totalvfs"], "numVfs": 0, "mtu": 4092 if port["link_type"] == "ib" else 9000,
            "linkType": "IB" if port["link_type"] == "ib" else "ETH", "linkSpeed": "400000 Mb/s",
            "linkAdminState": "up", "eSwitchMode": "legacy", "mac": f"b8:3f:d2:00:{index:02x}:00"})
    return interfaces


def release_finalizers(api: ApiServer) -> None:
    """The last case's operator is gone: the finalizers it put on its objects go as it would
    have taken them off, so a clean slate can delete them."""
    listed = api.kubectl("get", KINDS.replace(",nodes", ""), "-A", "-o", "json", check=False)
    for item in json.loads(listed.stdout or '{"items": []}')["items"]:
        if item["metadata"].get("finalizers"):
            api.kubectl("patch", item["kind"].lower(), item["metadata"]["name"], "-n", item["metadata"]["namespace"],
                        "--type=merge", "-p", '{"metadata": {"finalizers": null}}')


def node_states(api: ApiServer, namespace: str) -> dict[str, dict]:
    listed = json.loads(api.kubectl("get", "sriovnetworknodestates", "-n", namespace, "-o", "json").stdout)["items"]
    return {item["metadata"]["name"]: item for item in listed}


def wait(what: str, probe, seconds: float, log: Path):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(2)
    raise AssertionError(f"the SR-IOV operator never {what} in {seconds:.0f} s; see {log}:\n{log.read_text()[-3000:]}")


def images_in(api: ApiServer, namespace: str) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    for kind in ("daemonsets", "deployments"):
        for item in json.loads(api.kubectl("get", kind, "-n", namespace, "-o", "json").stdout)["items"]:
            spec = item["spec"]["template"]["spec"]
            for container in spec.get("initContainers", []) + spec["containers"]:
                seen.setdefault(container["image"], set()).add(f"{item['kind']} {item['metadata']['name']}")
    return seen


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_real_sriov_operator_takes_gpubootss_policies_as_planned(case, operator, api, helm, tmp_path):
    rendered = render_through_real_chart(CASES[case](tmp_path / "inventory"), "network-operator", "network_operator", helm, tmp_path)
    cluster, release, addon, namespace, objects = (rendered.cluster, rendered.release, rendered.addon,
                                                   rendered.namespace, rendered.objects)
    plan = cluster.nic_plan.as_data()
    if not plan["sriov"]:
        pytest.skip(f"{case} declares no SR-IOV group")
    binary, image_root, built_from = operator(parse_image(release.images["network_operator"]["sriovOperator"]).tag)
    api.apply_crds(objects)
    api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", str(image_root / "nad-crd.yaml"))
    api.established("network-attachment-definitions.k8s.cni.cncf.io")
    api.kubectl("delete", "network-attachment-definitions", "--all", "--all-namespaces", check=False)
    release_finalizers(api)
    api.clean_slate(namespace, KINDS, addon / "namespace.yaml")

    fabric = set(plan["node_labels"])
    # The SR-IOV operator's networks; the others (IPoIB, macvlan) are the Network Operator's.
    networks = [n for n in plan["networks"] if n["kind"] in ("SriovNetwork", "SriovIBNetwork")]
    others = [n.name for n in cluster.cluster_nodes if n.name not in fabric][:2]
    for name in [*sorted(fabric), *others]:
        # The kubelet's beta OS label (the chart's selector keeps it), and the Network Operator's
        # "DOCA driver up" label (the config daemon waits for it), on every node: only gpuboot's
        # fabric label keeps the others out.
        api.apply_node(name, {"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                               MOFED_WAIT: "false"})
        api.kubectl("taint", "nodes", name, "node.kubernetes.io/not-ready:NoSchedule-", check=False)
    api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", str(addon / "node-labels.yaml"))
    # What the chart installs beside the operator: its SriovOperatorConfig and ConfigMaps.
    chart_side = [o for o in objects if o["kind"] in ("SriovOperatorConfig", "ConfigMap")
                  and o["metadata"].get("namespace", namespace) == namespace]
    assert any(o["kind"] == "SriovOperatorConfig" for o in chart_side), f"{case}: the chart made no SriovOperatorConfig"
    api.kubectl("apply", "--server-side", "--field-manager=helm", "-n", namespace, "-f", "-",
                stdin=yaml.safe_dump_all(chart_side))
    # gpuboot's objects, as the phase applies them.
    for name in ("sriov.yaml", "networks.yaml"):
        if not (addon / name).is_file():
            assert name == "networks.yaml" and not networks, f"{case}: the phase rendered no {name}"
            continue
        documents = [d for d in yaml.safe_load_all((addon / name).read_text()) if d]
        # nv-ipam's IPPool CRD is the Network Operator's operand's, not installed here.
        documents = [d for d in documents if d["kind"] != "IPPool"]
        api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=yaml.safe_dump_all(documents))

    deployment = next(o for o in objects if o["kind"] == "Deployment"
                      and o["spec"]["template"]["spec"]["containers"][0]["command"] == ["sriov-network-operator"])
    env = chart_env(objects, deployment["metadata"]["name"]) | {
        "NAMESPACE": namespace, "WATCH_NAMESPACE": namespace, "POD_NAME": "sriov-network-operator-0",
        "NODE_NAME": sorted(fabric)[0], "KUBECONFIG": str(api.kubeconfig)}
    log = tmp_path / "sriov-operator.log"
    try:
        with controller(binary, env, image_root, log):
            def all_states():
                found = node_states(api, namespace)
                return found if set(found) >= fabric else None

            def all_specs():
                found = node_states(api, namespace)
                return found if all(found[n].get("spec", {}).get("interfaces") for n in fabric) else None

            def plugin_config():
                return api.kubectl("get", "configmap", "device-plugin-config", "-n", namespace, "-o", "json",
                                   check=False).stdout or None

            def all_nads():
                found = json.loads(api.kubectl("get", "network-attachment-definitions", "--all-namespaces", "-o",
                                               "json").stdout)["items"]
                return found if len(found) >= len(networks) else None

            states = wait("made a node state for every fabric node", all_states, SETTLE_S, log)
            assert set(states) == fabric, f"{case}: node states for {sorted(set(states) - fabric)}, outside the fabric"
            reported = {}
            for node in sorted(fabric):
                reported[node] = config_daemon_double(cluster, node)
                api.kubectl("patch", "sriovnetworknodestate", node, "-n", namespace, "--subresource=status",
                            "--type=merge", "-p", json.dumps({"status": {"interfaces": reported[node],
                                                                         "syncStatus": "Succeeded"}}))
            # The operator reads the reports on its next event or its 5 min resync: a change to
            # the pool (as any policy, pool or node-label change) is that event.
            api.kubectl("annotate", "--overwrite", "sriovnetworkpoolconfig", "gpuboot-fabric", "-n", namespace,
                        f"gpuboot.test/reported={time.time():.0f}")
            specs = wait("filled the node states' spec from the policies", all_specs, SETTLE_S, log)
            config = wait("wrote the device plugin's configuration", plugin_config, SETTLE_S, log)
            deployed = wait("deployed the config daemon", lambda: images_in(api, namespace) or None, SETTLE_S, log)
            nads = wait("wrote a NetworkAttachmentDefinition for every network", all_nads, SETTLE_S, log) \
                if networks else []
    finally:
        # What the API server held, kept beside the operator's log.
        (tmp_path / "seen.yaml").write_text(api.kubectl(
            "get", "nodes,sriovoperatorconfigs,sriovnetworknodepolicies,sriovnetworknodestates,configmaps,"
            "daemonsets", "-A", "-o", "yaml", check=False).stdout)

    # Each node's spec: every declared port of its SR-IOV groups, as the policy says, and no other.
    policies = {p["group"]: p for p in plan["sriov_policies"]}
    for node in sorted(fabric):
        by_pci = {i["pciAddress"]: i for i in reported[node]}
        want = {}
        for port, interface in zip(declared_ports(cluster, node), reported[node][:-1], strict=True):
            if port["group"] in policies:
                want[interface["pciAddress"]] = policies[port["group"]]
        got = {i["pciAddress"]: i for i in specs[node]["spec"]["interfaces"]}
        assert set(got) == set(want), (f"{case}: {node}'s spec takes {sorted(by_pci[p]['name'] for p in got)}, "
                                       f"gpuboot's groups {sorted(by_pci[p]['name'] for p in want)}")
        for pci, policy in want.items():
            interface = got[pci]
            assert interface["numVfs"] == policy["numVfs"], (case, node, interface)
            assert interface["linkType"].lower() == policy["linkType"], (case, node, interface)
            groups = interface.get("vfGroups") or []
            assert [g["resourceName"] for g in groups] == [policy["resourceName"]], (case, node, interface)
            assert groups[0]["deviceType"] == policy["deviceType"] and groups[0]["policyName"] == policy["name"], \
                (case, node, interface)
            assert groups[0].get("isRdma", False) == policy["isRdma"], (case, node, interface)

    # The device plugin's configuration: each group's resource, selected as gpuboot selects it.
    data = json.loads(config)["data"]
    for node in sorted(fabric):
        assert node in data, f"{case}: the device plugin has no configuration for {node}: {sorted(data)}"
        resources = {r["resourceName"]: r for r in json.loads(data[node])["resourceList"]}
        groups = {p["group"] for p in declared_ports(cluster, node) if p["group"] in policies}
        assert set(resources) == {policies[g]["resourceName"] for g in groups}, (case, node, resources)
        for group in groups:
            policy, resource = policies[group], resources[policies[group]["resourceName"]]
            assert resource.get("resourcePrefix", plan["sriov_resource_prefix"]) == plan["sriov_resource_prefix"]
            selectors = resource["selectors"]
            selectors = selectors[0] if isinstance(selectors, list) else selectors
            assert selectors.get("vendors") == [policy["nicSelector"]["vendor"]], (case, node, resource)
            for key, plugin_key in (("pfNames", "pfNames"), ("rootDevices", "rootDevices")):
                if key in policy["nicSelector"]:
                    assert sorted(selectors.get(plugin_key) or []) == sorted(policy["nicSelector"][key]), \
                        (case, node, key, resource)

    # Images: what the operator deploys is planned, and what the plan holds for it is deployed.
    planned = {str(image.ref) for image in build(release, Target.of(cluster, release)).only({"network_operator"}).images}
    unplanned = sorted(f"{image} ({', '.join(sorted(where))})" for image, where in deployed.items()
                       if image not in planned)
    assert not unplanned, f"{case}: the SR-IOV operator deploys images the mirror plan lacks: {unplanned}"
    images = release.images["network_operator"]
    never = sorted(key for key in SRIOV_IMAGES if key in images and images[key] in planned
                   and images[key] not in deployed)
    assert not never, f"{case}: the plan holds SR-IOV images the operator never deployed: {never}"

    # Each network: a NetworkAttachmentDefinition where its pods are, asking for its resource.
    made = {(n["metadata"]["namespace"], n["metadata"]["name"]): n for n in nads}
    for network in networks:
        nad = made.get((network["namespace"], network["name"]))
        assert nad is not None, f"{case}: no NetworkAttachmentDefinition {network['namespace']}/{network['name']}"
        annotation = nad["metadata"].get("annotations", {}).get("k8s.v1.cni.cncf.io/resourceName")
        assert annotation == f"{plan['sriov_resource_prefix']}/{network['resourceName']}", (case, nad)
        cni = json.loads(nad["spec"]["config"])
        assert cni["type"] == ("ib-sriov" if network["kind"] == "SriovIBNetwork" else "sriov"), (case, cni)
        assert cni["ipam"] == {"type": "nv-ipam", "poolName": network["pool"]}, (case, cni)
    print(f"{case}: {built_from}; node states {sorted(fabric)}, {len(deployed)} images, {len(nads)} networks")
