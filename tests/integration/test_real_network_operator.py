"""NVIDIA's real Network Operator reconciles gpuboot's NicClusterPolicy (issue 29, points 3 and
4): the controller built from Mellanox/network-operator's tree at the tag the release pins, as
`gpuboot lab operators bundle` builds its image, its state manifests from the same tag where
its chart points STATE_MANIFEST_BASE_DIR, run against a real API server of this module's own
(it labels Nodes) with the environment the real chart's Deployment gives it. gpuboot's values
are rendered through the real chart; the node labels and the NicClusterPolicy are applied as
the phase applies them; each fabric node of the inventory carries the labels NFD would give it
(the Mellanox PCI vendor, the OS release, the kernel, the architecture).

What the operator then deploys is held against gpuboot:
- every image of every DaemonSet and Deployment it makes (init containers included) is in the
  mirror plan, and every image the plan lists for what this operator deploys is deployed;
- the DOCA driver: the operator lists the driver's tags in the mirror and picks the one for
  each node's kernel, OS and architecture (forcePrecompiled: that tag or nothing). A real
  registry on loopback stands for the mirror and holds exactly the DOCA tags the mirror plan
  lists, so a tag gpuboot plans under another name than the operator looks for fails here;
- each operand runs on every fabric node: the node affinity and selector of its DaemonSets
  (the DOCA driver has one per kernel) select each of them, and no node outside the fabric.

No kubelet runs here, so no operand pod exists: readiness, the VFs and the RDMA bandwidth test
are the lab's (with doubles) and a real NIC's. The SR-IOV operator's operands are its own, and
test_real_sriov_operator.py runs that operator. Skipped, naming what to bring, without the
source tree."""
from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpuboot.mirror.plan import Target, build
from gpuboot.mirror.serve import ServeSpec, start
from gpuboot.net import free_port
from tests.cli.test_network_renders import nic_only, shared_networks
from tests.doubles.kubelet_double import untainted_node
from tests.integration import test_real_gpu_operator
from tests.integration.test_addon_objects_dry_run import ThroughRealChart, render_through_real_chart
from tests.integration.test_real_gpu_operator import built_image, nfd_labels
from tests.support.apiserver import ApiServer
from tests.support.mirror_fixture import IMAGE_CACHE
from tests.support.oci_layout import busybox_binaries, push, write_layout

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# Each makes its inventory in the folder it is given: the sample, the mixed NIC fleet (INI with
# host ranges and group_vars/), the GPU case with RDMA, RDMA shared ports only on two
# architectures, and fabric NICs without a GPU node (the chart's own NFD).
CASES: dict[str, Callable[[Path], Path]] = {
    "sample": lambda tmp: ROOT / "inventories" / "sample" / "inventory.yml",
    "mixed-fleet": lambda tmp: ROOT / "tests" / "fixtures" / "mixed-fleet" / "hosts.ini",
    "rdma_present": lambda tmp: ROOT / "tests" / "corpus" / "gpu" / "rdma_present" / "inventory.yml",
    "shared-networks": shared_networks,
    "nic-only": nic_only,
}
# What the plan lists for the component that this operator does not deploy: the chart runs the
# operator, its own NFD (on a cluster without GPU nodes) and the SR-IOV operator, the SR-IOV operator runs its config daemon (whose init
# containers copy the CNI plugins) and device plugin, and the bandwidth test is gpuboot's.
NOT_DEPLOYED_BY_IT = ("operator", "nfd", "sriovOperator", "sriovConfigDaemon", "sriovDevicePlugin", "sriovCni",
                      "ibSriovCni", "rdmaCni", "bandwidthTest")
SETTLE_S = 45
WORKLOADS = ("daemonsets", "deployments")
MOFED_WAIT = "network.nvidia.com/operator.mofed.wait"

# An API server of this module's own, as the GPU Operator's test has: the operator labels Nodes.
api = test_real_gpu_operator.api


@pytest.fixture(scope="module")
def operator_image(tmp_path_factory) -> tuple[Path, Path]:
    """(manager binary, the image's root: /manifests, /crds, /webhook-schemas)."""
    bin_dir, root = built_image("network_operator", "network-operator", tmp_path_factory.mktemp("network-operator-image"))
    return bin_dir / "manager", root


@pytest.fixture
def registry(tmp_path_factory):
    """A real registry on loopback (plain HTTP, which the operator's registry client uses for
    a loopback host) standing for the mirror, one per case: it holds exactly the case's planned
    DOCA tags (the operator prefers a precompiled tag for the node's kernel wherever one is
    listed, so another case's would be taken)."""
    root = tmp_path_factory.mktemp("doca-mirror")
    write_layout(root / "layout", "doca", busybox_binaries(IMAGE_CACHE), "doca-driver")
    running = start(ServeSpec(root / "registry", f"127.0.0.1:{free_port()}", tls=False))
    yield running, root / "layout"
    running.stop()


def fabric_nodes(cluster) -> dict[str, dict[str, str]]:
    """Each fabric node (the NIC plan's) and the labels NFD and the kubelet would give it. The
    kernels the inventory names are spread over the nodes, and the architectures over the DOCA
    driver's pools (OS and kernel): the operator gives a pool one architecture's image, so
    preflight refuses a pool of two (roles/preflight), and a fleet here has none."""
    settings = cluster.settings
    kernels = list(settings.node_os.kernels if settings.node_os else [])
    architectures = list(settings.node_os.architectures if settings.node_os else ["amd64"])
    found, pools = {}, []
    for index, name in enumerate(sorted(cluster.nic_plan.node_labels())):
        node = next(n for n in cluster.cluster_nodes if n.name == name)
        os_id = node.settings.os or settings.node_os.id
        kernel = node.settings.kernel or kernels[index % len(kernels)]
        pools += [(os_id, kernel)] if (os_id, kernel) not in pools else []
        found[name] = {**nfd_labels(os_id, kernel, pci_vendor="15b3"),
                       "kubernetes.io/arch": architectures[pools.index((os_id, kernel)) % len(architectures)]}
    return found


def doca_tags_without_a_node(planned: set[str], fabric: dict[str, dict[str, str]], version: str) -> set[str]:
    """The planned DOCA driver images no fabric node here could take: the plan lists each kernel
    for each architecture of the fleet (it cannot know which node runs which); the nodes made
    here run some of those pairs. A tag is <version>-<os tag>-<arch>, or precompiled
    <version>-<kernel>-<os tag>-<arch>."""
    servable = set()
    for labels in fabric.values():
        os_tag = labels["feature.node.kubernetes.io/system-os_release.ID"] + \
            labels["feature.node.kubernetes.io/system-os_release.VERSION_ID"]
        kernel, arch = labels["feature.node.kubernetes.io/kernel-version.full"], labels["kubernetes.io/arch"]
        servable |= {f"{version}-{os_tag}-{arch}", f"{version}-{kernel}-{os_tag}-{arch}"}
    return {ref for ref in planned if "/doca-driver:" in ref and ref.rsplit(":", 1)[1] not in servable}


def chart_env(objects: list[dict], name: str) -> dict[str, str]:
    """The environment the real chart gives the operator's container. A value the chart leaves
    empty (the OVS CNI image, which gpuboot does not name) is the empty string the kubelet gives
    it, never Python's "None"."""
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: "" if e["value"] is None else str(e["value"]) for e in container.get("env", []) if "value" in e}


@contextmanager
def controller(binary: Path, env: dict[str, str], cwd: Path, log: Path):
    """A controller binary run as its Deployment runs it, with `env`, on loopback ports for its
    metrics and probes, its output in `log`; stopped on leaving."""
    with log.open("w") as out:
        process = subprocess.Popen([str(binary), "--metrics-bind-address", "127.0.0.1:0",
                                    "--health-probe-bind-address", "127.0.0.1:0"],
                                   env=dict(os.environ, **env), stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            yield process
        finally:
            process.terminate()
            process.wait(30)


def deployed(api: ApiServer, namespace: str, seconds: float) -> tuple[dict[str, set[str]], dict[str, dict]]:
    """image -> where, over `seconds` of reconciling, and every workload seen."""
    seen: dict[str, set[str]] = {}
    workloads: dict[str, dict] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for kind in WORKLOADS:
            proc = api.kubectl("get", kind, "-n", namespace, "-o", "json", check=False)
            if proc.returncode != 0:
                continue
            for item in json.loads(proc.stdout)["items"]:
                where = f"{item['kind']} {item['metadata']['name']}"
                workloads[where] = item
                spec = item["spec"]["template"]["spec"]
                for container in spec.get("initContainers", []) + spec["containers"]:
                    seen.setdefault(container["image"], set()).add(f"{where}/{container['name']}")
        time.sleep(3)
    return seen, workloads


def selects(pod_spec: dict, labels: dict[str, str]) -> bool:
    """Whether a pod with this spec may run on a node with these labels: its nodeSelector and
    its required node affinity (terms ORed, expressions ANDed; In, NotIn, Exists, DoesNotExist)."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True

    def holds(expression: dict) -> bool:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        return {"In": lambda: labels.get(key) in values, "NotIn": lambda: labels.get(key) not in values,
                "Exists": lambda: key in labels, "DoesNotExist": lambda: key not in labels}[operator]()

    return any(all(holds(e) for e in term.get("matchExpressions") or []) for term in required["nodeSelectorTerms"])


@dataclass
class AppliedAsThePhase:
    """A case's Network Operator objects on the API server, as the phase applies them."""
    rendered: ThroughRealChart
    fabric: dict[str, dict[str, str]]  # fabric node -> NFD's labels
    others: list[str]                  # nodes outside the fabric
    planned: set[str]                  # the mirror plan's images for the component
    registry: str                      # the loopback registry standing for the mirror


def apply_as_the_phase(inventory: Path, api: ApiServer, helm: Path, tmp_path: Path, registry,
                       make_node: Callable[[ApiServer, str, dict[str, str]], None]) -> AppliedAsThePhase:
    """The case rendered through the real chart, its CRDs, a clean namespace, its fabric Nodes
    (made by `make_node` with NFD's labels) and two outside it, gpuboot's node labels, the
    mirror's login and CA, and the NicClusterPolicy pointed at the loopback registry, which
    then holds exactly the DOCA tags the mirror plan lists."""
    mirror, layout = registry
    rendered = render_through_real_chart(inventory, "network-operator", "network_operator", helm, tmp_path)
    cluster, release, addon = rendered.cluster, rendered.release, rendered.addon
    api.apply_crds(rendered.objects)
    # A clean slate per case: the operator's workloads, the policy and the Nodes of the last one.
    api.clean_slate(rendered.namespace, "nicclusterpolicies.mellanox.com,nodes", addon / "namespace.yaml")
    fabric = fabric_nodes(cluster)
    # Nodes outside the fabric too: the operator must leave them alone.
    others = [n.name for n in cluster.cluster_nodes if n.name not in fabric][:2]
    for name in [*fabric, *others]:
        make_node(api, name, fabric.get(name, {}))
    api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", str(addon / "node-labels.yaml"))
    # The mirror's login and CA, as the phase writes them (render shows where each comes from):
    # the loopback registry takes no login.
    if (addon / "mirror-access.yaml").is_file():
        access = [d for d in yaml.safe_load_all((addon / "mirror-access.yaml").read_text()) if d]
        for document in access:
            if document["kind"] == "Secret":
                document["stringData"] = {".dockerconfigjson": json.dumps({"auths": {}})}
        api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=yaml.safe_dump_all(access))
    # The DOCA driver's tags are listed where the policy says (the mirror, or nvcr.io): the
    # loopback registry stands for that host, holding the DOCA images the mirror plan lists.
    plan = build(release, Target.of(cluster, release)).only({"network_operator"})
    planned = {str(image.ref) for image in plan.images}
    for ref in sorted(r for r in planned if "/doca-driver:" in r):
        push(layout, "doca", f"{mirror.spec.listen}/{ref}")
    policy = yaml.safe_load((addon / "nic-cluster-policy.yaml").read_text())
    registry_host = cluster.settings.mirror.registry if cluster.settings.mirror.air_gapped else None
    doca = policy["spec"]["ofedDriver"]
    upstream_repository = doca["repository"].removeprefix(f"{registry_host}/") if registry_host else doca["repository"]
    doca["repository"] = f"{mirror.spec.listen}/{upstream_repository}"
    api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=yaml.safe_dump(policy))
    return AppliedAsThePhase(rendered, fabric, others, planned, mirror.spec.listen)


def operator_env(applied: AppliedAsThePhase, image_root: Path, api: ApiServer) -> dict[str, str]:
    """The operator's environment: the real chart's, its state manifests from the same tag."""
    rendered = applied.rendered
    return chart_env(rendered.objects, rendered.chart_name) | {
        "STATE_MANIFEST_BASE_DIR": str(image_root / "manifests"), "POD_NAMESPACE": rendered.namespace,
        "KUBECONFIG": str(api.kubeconfig), "ENABLE_WEBHOOKS": "false"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_real_network_operator_deploys_what_the_mirror_plan_lists(case, operator_image, registry, api, helm,
                                                                      tmp_path):
    binary, image_root = operator_image
    applied = apply_as_the_phase(CASES[case](tmp_path / "inventory"), api, helm, tmp_path, registry, untainted_node)
    rendered, fabric, others, planned = applied.rendered, applied.fabric, applied.others, applied.planned
    release, namespace = rendered.release, rendered.namespace
    listen = applied.registry
    log = tmp_path / "operator.log"
    with controller(binary, operator_env(applied, image_root, api), image_root, log):
        seen, workloads = deployed(api, namespace, SETTLE_S)
    assert seen, f"{case}: the operator deployed nothing in {SETTLE_S} s; see {log}:\n{log.read_text()[-3000:]}"

    # The DOCA driver is named by the mirror: the plan holds it under its upstream name.
    upstream = {image: image.removeprefix(f"{listen}/") for image in seen}
    operands = planned - {release.images["network_operator"][key] for key in NOT_DEPLOYED_BY_IT
                          if key in release.images["network_operator"]}
    unplanned = sorted(f"{image} ({', '.join(sorted(seen[image]))})" for image, name in upstream.items()
                       if name not in planned)
    assert not unplanned, f"{case}: NVIDIA's Network Operator deploys images the mirror plan lacks: {unplanned}"
    unservable = doca_tags_without_a_node(planned, fabric, str(release.network_operator["doca_driver_version"]))
    never = sorted(operands - unservable - set(upstream.values()))
    assert not never, f"{case}: the plan lists images the Network Operator never deployed: {never}"

    # Nodes as they stand once their DOCA driver is up: the operator then sets the wait label
    # that holds the RDMA plugin back until the driver is loaded (no kubelet here runs the driver).
    nodes = {n["metadata"]["name"]: {**(n["metadata"].get("labels") or {}), MOFED_WAIT: "false"}
             for n in json.loads(api.kubectl("get", "nodes", "-o", "json").stdout)["items"]}
    # One operand can be several DaemonSets (the DOCA driver: one per OS and kernel); an
    # operand is known by its containers' names.
    operands_on: dict[tuple[str, ...], set[str]] = {}
    placement: dict[tuple[str, ...], list] = {}
    for where, item in sorted(workloads.items()):
        if item["kind"] != "DaemonSet":
            continue
        spec = item["spec"]["template"]["spec"]
        operand = tuple(sorted(c["name"] for c in spec["containers"]))
        operands_on.setdefault(operand, set()).update(name for name in nodes if selects(spec, nodes[name]))
        placement.setdefault(operand, []).append({"nodeSelector": spec.get("nodeSelector"),
                                                  "affinity": spec.get("affinity")})
        strays = sorted(name for name in others if selects(spec, nodes[name]))
        assert not strays, f"{case}: {where} would run on {strays}, outside the fabric"
    for operand, on in sorted(operands_on.items()):
        missed = sorted(set(fabric) - on)
        assert not missed, (f"{case}: no DaemonSet of {'/'.join(operand)} runs on fabric nodes {missed}: "
                            f"{placement[operand]}; {missed[0]} has {nodes[missed[0]]}")
    print(f"{case}: {len(workloads)} workloads, {len(seen)} images, all planned; fabric {sorted(fabric)}; "
          f"DOCA tags planned for kernel and architecture pairs no node here runs: {sorted(unservable)}")
