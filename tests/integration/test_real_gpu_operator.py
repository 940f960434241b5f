"""NVIDIA's real GPU Operator reconciles gpuboot's configuration (issue 29, points 3 and 4): the
controller built from its source tree at the tag the release pins (vendored, as
`GpuKit.build_tool` builds from a tree), its operand manifests from the same tag mounted where
it reads them (/opt/gpu-operator, in a mount namespace of its own), run against a real API
server (its own here: it labels Nodes). gpuboot's values are rendered through the real chart;
the ClusterPolicy, gpuboot's ConfigMaps, node labels and NVIDIADriver objects are applied as the
phase applies them; one Node per GPU node of the inventory carries the labels NFD would give it
(the PCI vendor, the OS release, the kernel).

What the operator then deploys is held against gpuboot:
- every image of every operand DaemonSet (init containers included) is in the mirror plan, and
  every image the plan lists for the operator's operands is deployed: the plan is what NVIDIA's
  controller asks for, per OS and kernel, not what a double of it was written to ask for;
- every driver DaemonSet, the ClusterPolicy's or an NVIDIADriver's, is counted as the driver by
  validate's gate (operand_of in playbooks/module_utils/gpuboot_kube.py);
- every operand the gate demands of a GPU node is a DaemonSet whose node selector the node, as
  the operator labelled it, satisfies.

No kubelet runs here, so no operand pod exists: readiness, the device plugin and the driver
upgrade's walk are the lab's (with doubles) and the real GPU's. Skipped, naming what to bring,
without the source tree, root or unshare."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.mirror.plan import Target, build
from gpuboot_lab import LAB_RELEASE
from gpuboot_lab.kubernetes import KubernetesBuild, matrix_versions
from gpuboot_lab.operators import OPERATORS, OperatorBuild, source_version
from tests.integration.test_addon_objects_dry_run import render_through_real_chart
from tests.integration.test_double_schemas_vs_real_charts import source_tree
from tests.support.apiserver import ETCD, ApiServer
from tests.support.modules import load_module

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# The sample and every GPU case of the corpus: the plan is held to what NVIDIA's operator deploys
# for each, not to a double of its choice.
CASES = {"sample": ROOT / "inventories" / "sample" / "inventory.yml",
         **{p.name: p / "inventory.yml" for p in sorted((ROOT / "tests" / "corpus" / "gpu").iterdir()) if p.is_dir()}}
NAMESPACE = "gpu-operator"
# What the plan lists for the operator's component that the operator itself never deploys: the
# chart runs NFD, and validate's smoke Job is gpuboot's. (The operator's own image is also its
# validator's, which it deploys.)
NOT_DEPLOYED_BY_IT = ("nfd", "smokeTest")
SETTLE_S = 45  # it reconciles every few seconds; a driver DaemonSet per kernel can come and go


def nfd_labels(os_id: str, kernel: str, pci_vendor: str = "10de") -> dict[str, str]:
    """What NFD would label a node with: the PCI vendor (NVIDIA's GPUs; 15b3 for Mellanox NICs),
    the OS release, the kernel."""
    distro, _, version = os_id.partition("-")
    return {f"feature.node.kubernetes.io/pci-{pci_vendor}.present": "true",
            "feature.node.kubernetes.io/system-os_release.ID": distro,
            "feature.node.kubernetes.io/system-os_release.VERSION_ID": version,
            "feature.node.kubernetes.io/kernel-version.full": kernel}


def built_image(component: str, chart: str, root: Path) -> tuple[Path, Path]:
    """(binaries' directory, `root` holding the image's files) of the component's operator for
    the lab's release, built as `gpuboot lab operators bundle` builds its image; skips, naming
    the source tree, where it is absent."""
    release = matrix.load(LAB_RELEASE)
    spec = next(s for s in OPERATORS if s.component == component and s.key == "operator")
    version = source_version(release, spec)
    source_tree(chart, version.lstrip("v") if chart == "network-operator" else version, release.name)
    build = OperatorBuild(log=print)
    for path, data, mode in build.files(spec, version):
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)
    return build.build(spec, version), root


@pytest.fixture(scope="module")
def operator_image(tmp_path_factory) -> tuple[Path, Path]:
    """(gpu-operator binary, what its image holds under /opt/gpu-operator)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the operator reads /opt/gpu-operator: it runs in a mount namespace, as root with unshare")
    bin_dir, root = built_image("gpu_operator", "gpu-operator", tmp_path_factory.mktemp("image-root"))
    return bin_dir / "gpu-operator", root / "opt" / "gpu-operator"


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """An API server of this module's own: the operator labels the Nodes made here."""
    if shutil.which(ETCD) is None or shutil.which("go") is None:
        pytest.fail("etcd and go are needed (bootstrap/setup.sh installs etcd-server; Go 1.24 or newer on PATH)")
    newest = sorted(matrix_versions(), key=lambda v: tuple(int(p) for p in v.lstrip("v").split(".")))[-1]
    built = KubernetesBuild(log=lambda m: None).build(newest)
    server = ApiServer(tmp_path_factory.mktemp("operator-api"), built.bin_dir).start()
    yield server
    server.stop()


def gfd_labels(node_gpu) -> dict[str, str]:
    """What GPU Feature Discovery would add (the operator deploys the MIG manager where GFD says
    the GPU is MIG-capable): the labels validate expects of the node, and mig.capable."""
    labels = dict(node_gpu.gfd_labels())
    if node_gpu.model is not None:
        labels["nvidia.com/mig.capable"] = "true" if node_gpu.model.mig is not None else "false"
    return labels


def gpu_nodes(cluster) -> dict[str, dict[str, str]]:
    """Each GPU node and the labels NFD and GFD would give it; the kernels the inventory names
    are spread over the nodes so that each is some node's."""
    settings = cluster.settings
    resolved = cluster.gpu_plan
    found, kernels = {}, list(settings.node_os.kernels if settings.node_os else [])
    names = sorted(resolved.nodes)
    # More kernels than GPU nodes: another node of the first's kind for each kernel left.
    for index in range(max(len(names), len(kernels))):
        name = names[index] if index < len(names) else f"{names[0]}-k{index}"
        like = names[min(index, len(names) - 1)]
        node = next(n for n in cluster.cluster_nodes if n.name == like)
        os_id = node.settings.os or settings.node_os.id
        kernel = node.settings.kernel or kernels[index % len(kernels)]
        found[name] = {**nfd_labels(os_id, kernel), **gfd_labels(resolved.nodes[like])}
    return found


def chart_env(objects: list[dict]) -> dict[str, str]:
    """The environment the real chart gives the operator's container (the driver manager's and
    the validator's images among it), as its Deployment would run it."""
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpu-operator")
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "gpu-operator")
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


# In the operator's own mount namespace: an empty /opt of its own, the image's assets bound at
# /opt/gpu-operator. Nothing is made on the host, so operators run by other test lanes at the
# same time never share (or remove) a mount point.
OWN_OPT = ('mount -t tmpfs gpuboot-operator-opt /opt && mkdir /opt/gpu-operator'
           ' && mount --bind "$0" /opt/gpu-operator && shift && exec "$@"')


def start_operator(binary: Path, opt: Path, api: ApiServer, objects: list[dict], out) -> subprocess.Popen:
    """The operator as its Deployment runs it: the chart's environment, its operand manifests
    at /opt/gpu-operator (in a mount namespace of its own), output to `out`."""
    return subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", OWN_OPT, str(opt),
         "x", str(binary), "-kubeconfig", str(api.kubeconfig), "-metrics-bind-address", "127.0.0.1:0",
         "-health-probe-bind-address", "127.0.0.1:0"],
        env=dict(os.environ, **chart_env(objects), OPERATOR_NAMESPACE=NAMESPACE), stdout=out, stderr=subprocess.STDOUT)


def deployed_images(api: ApiServer, seconds: float) -> tuple[dict[str, set[str]], list[dict]]:
    """image -> where, over `seconds` of reconciling, and every DaemonSet seen. (With no kubelet
    a precompiled driver's DaemonSet schedules nothing, so the operator deletes it as unused
    and makes it again: it is seen now and then, not always.)"""
    seen: dict[str, set[str]] = {}
    daemonsets: dict[str, dict] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        proc = api.kubectl("get", "daemonsets", "-n", NAMESPACE, "-o", "json", check=False)
        if proc.returncode == 0:
            for ds in json.loads(proc.stdout)["items"]:
                daemonsets[ds["metadata"]["name"]] = ds
                spec = ds["spec"]["template"]["spec"]
                for container in spec.get("initContainers", []) + spec["containers"]:
                    seen.setdefault(container["image"], set()).add(f"{ds['metadata']['name']}/{container['name']}")
        time.sleep(3)
    return seen, list(daemonsets.values())


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_real_operator_deploys_what_the_mirror_plan_lists(case, operator_image, api, helm, tmp_path):
    binary, opt = operator_image
    rendered = render_through_real_chart(CASES[case], "gpu-operator", "gpu_operator", helm, tmp_path)
    cluster, release, addon, objects = rendered.cluster, rendered.release, rendered.addon, rendered.objects
    assert rendered.namespace == NAMESPACE, "the operator is run in the namespace the phase renders"
    api.apply_crds(objects)
    # A clean slate per case: the operator's DaemonSets, the policies and the Nodes of the last one.
    api.clean_slate(NAMESPACE, "clusterpolicies.nvidia.com,nvidiadrivers.nvidia.com,nodes", addon / "namespace.yaml")
    for name, labels in gpu_nodes(cluster).items():
        api.apply_node(name, labels)
    for file in ("device-plugin-config.yaml", "mig-parted-config.yaml", "node-labels.yaml", "nvidia-drivers.yaml"):
        if (addon / file).is_file():
            api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", str(addon / file))
    policy = [o for o in objects if o["kind"] == "ClusterPolicy"]
    api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=yaml.safe_dump_all(policy))

    log = tmp_path / "operator.log"
    with log.open("w") as out:
        operator = start_operator(binary, opt, api, objects, out)
        try:
            seen, daemonsets = deployed_images(api, SETTLE_S)
        finally:
            operator.terminate()
            operator.wait(30)
    assert seen, f"{case}: the operator deployed nothing in {SETTLE_S} s; see {log}:\n{log.read_text()[-3000:]}"

    plan = build(release, Target.of(cluster, release)).only({"gpu_operator"})
    planned = {str(image.ref) for image in plan.images}
    operands = planned - {release.images["gpu_operator"][key] for key in NOT_DEPLOYED_BY_IT}
    unplanned = sorted(f"{image} ({', '.join(sorted(where))})" for image, where in seen.items() if image not in planned)
    assert not unplanned, f"{case}: NVIDIA's operator deploys images the mirror plan lacks: {unplanned}"
    never = sorted(operands - set(seen))
    assert not never, f"{case}: the plan lists operand images the operator never deployed: {never}"

    check = load_module("gpuboot_cluster_check")
    drivers = [ds for ds in daemonsets
               if ds["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "nvidia-driver"]
    for ds in drivers:
        pod = {"metadata": {"name": ds["metadata"]["name"] + "-x", "labels": ds["spec"]["template"]["metadata"]["labels"]}}
        assert check.operand_of(pod) == "nvidia-driver-daemonset", ds["metadata"]["name"]
    # What the gate demands of each GPU node is a DaemonSet of the operator's that selects it.
    nodes = {n["metadata"]["name"]: n["metadata"].get("labels") or {}
             for n in json.loads(api.kubectl("get", "nodes", "-o", "json").stdout)["items"]}
    for name, node_gpu in sorted(cluster.gpu_plan.nodes.items()):
        selecting = {check.operand_of({"metadata": {"name": ds["metadata"]["name"],
                                                    "labels": ds["spec"]["template"]["metadata"]["labels"]}})
                     for ds in daemonsets
                     if all(nodes[name].get(k) == v for k, v in (ds["spec"]["template"]["spec"].get("nodeSelector")
                                                                   or {}).items())}
        short = [app for app in node_gpu.operand_apps()
                 if not any(app == got or got.startswith(app + "-") for got in selecting)]
        assert not short, f"{case}: the gate demands {short} on {name}, which no DaemonSet of the operator selects"
    print(f"{case}: {len(daemonsets)} DaemonSets, {len(seen)} images, all planned; "
          f"drivers: {sorted(ds['metadata']['name'] for ds in drivers)}")
