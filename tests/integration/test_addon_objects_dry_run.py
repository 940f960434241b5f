"""Every object gpuboot would apply for the add-ons is accepted by a real API server (issue 13,
point 6; issue 14 for the Network Operator; issue 29, point 2): for the sample, the mixed NIC
fleet and each GPU case, what `gpuboot render` writes is rendered with the real helm exactly as
the phases do (playbooks/group_vars/all/charts.yml: `helm template` for the cluster's Kubernetes
version, values on stdin), the CRDs are applied for real and established, and every other
object, gpuboot's own custom resources included, passes a server-side dry run of a server-side
apply (strict field validation: a field the CRD does not know fails).

Each case runs through the REAL charts at the tag the case's release pins, read from the
upstream source trees where they are on this machine (`GPUBOOT_UPSTREAM_SOURCES`, as in
test_double_schemas_vs_real_charts.py): NVIDIA's and Calico's own templates and CRDs judge
gpuboot's custom resources, and every key of gpuboot's values must be one the real chart has
(helm ignores any other). Calico's also runs through its chart DOUBLES (tests/doubles/charts,
whose closed schemas refuse an unknown key), for machines without the trees; NVIDIA's charts
have no double. The API server is real either way."""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.mirror.plan import Target, build
from tests.cli.test_network_renders import nic_only
from tests.integration.test_double_schemas_vs_real_charts import source_tree, unknown_keys
from tests.support.addon_doubles import CHARTS, double_chart_at
from tests.support.apiserver import ApiServer
from tests.support.modules import load_filter

chart_hooks = load_filter("chart_hooks")
chart_namespace = load_filter("chart_namespace")

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# nic-only: fabric NICs and no GPU node, so the Network Operator's chart brings NFD.
CASES = {"sample": ROOT / "inventories" / "sample" / "inventory.yml",
         "mixed-fleet": ROOT / "tests" / "fixtures" / "mixed-fleet" / "hosts.ini", "nic-only": nic_only,
         **{p.name: p / "inventory.yml" for p in sorted((ROOT / "tests" / "corpus" / "gpu").iterdir()) if p.is_dir()}}
# addon directory -> (chart, release name, namespace, files applied before / after the chart)
ADDONS = {
    "calico": ("tigera-operator", "tigera-operator", ["namespace.yaml"], []),
    "gpu-operator": ("gpu-operator", "gpu-operator", ["namespace.yaml", "device-plugin-config.yaml",
                                                      "mig-parted-config.yaml", "node-labels.yaml"],
                     ["nvidia-drivers.yaml"]),
    # mirror-access.yaml is left out: render shows a reference where the phase writes the login.
    "network-operator": ("network-operator", "nvidia-network-operator", ["namespace.yaml", "node-labels.yaml"],
                         ["nic-cluster-policy.yaml", "sriov.yaml", "networks.yaml"]),
}


class ChartSource:
    """Where a chart comes from: the doubles, or the upstream source tree at the pinned tag
    (extracted once per tag with `git archive`)."""

    def __init__(self, kind: str, cache: Path) -> None:
        self.kind, self.cache = kind, cache

    def has(self, name: str) -> bool:
        """Whether this source has the chart: every upstream one; a double only where one is
        kept (Calico's: NVIDIA's charts are only ever the real ones)."""
        return self.kind == "real" or (CHARTS / name).is_dir()

    def chart(self, name: str, version: str, release: str) -> Path:
        if self.kind == "double":
            return double_chart_at(name, version, self.cache / f"double-{version}")
        upstream, git_dir, tag = source_tree(name, version, release)
        into = self.cache / f"{upstream.repository}-{tag}"
        if not (into / upstream.chart_dir).is_dir():
            into.mkdir(parents=True, exist_ok=True)
            wanted = [upstream.chart_dir]
            while wanted:
                extract(git_dir, tag, wanted, into)
                # A chart's symlink into the rest of the tree (Calico's CRD chart links its CRDs)
                # is resolved in a packaged chart: its target comes out of the same tag.
                wanted = sorted({str(Path(os.path.normpath(link.parent / os.readlink(link))).relative_to(into))
                                 for link in (into / upstream.chart_dir).rglob("*")
                                 if link.is_symlink() and not link.exists()})
        return into / upstream.chart_dir


    def runtime_crds(self, name: str, version: str, release: str, policies: list[dict]) -> list[dict]:
        """The CRDs a real operator applies itself once its policy asks for a state (the
        Network Operator's nv-ipam IPPool: `manifests/state-nv-ipam-cni`, not its chart)."""
        _, git_dir, tag = source_tree(name, version, release)
        found = []
        for section, state in RUNTIME_STATES.get(name, {}).items():
            if not any(section in (policy.get("spec") or {}) for policy in policies):
                continue
            listed = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "--name-only", f"{tag}:{state}"],
                                    capture_output=True, text=True, check=True).stdout.split()
            for file in listed:
                text = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{tag}:{state}/{file}"],
                                      capture_output=True, text=True, check=True).stdout
                if "kind: CustomResourceDefinition" in text:
                    found += [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "CustomResourceDefinition"]
        return found


# chart -> {policy spec section: the operator's state directory whose CRDs it applies for it}
RUNTIME_STATES = {"network-operator": {"nvIpam": "manifests/state-nv-ipam-cni"}}


# Images an operator's Deployment names for a feature gpuboot leaves off: (kind, the fields of
# the rendered object any of which turns it on, each with the operator's default when absent). The SR-IOV operator deploys the webhook, the
# resources injector, the metrics exporter and the DRA driver only when its SriovOperatorConfig
# says so. The GPU Operator runs k8s-driver-manager only as the init container of the pods
# that load a driver: its own driver, the vGPU manager and the VFIO manager (sandbox
# workloads); on hosts with a preinstalled driver none of them runs.
IMAGES_FOR_FEATURES = {
    "SRIOV_NETWORK_WEBHOOK_IMAGE": ("SriovOperatorConfig", ((("spec", "enableOperatorWebhook"), False),)),
    "NETWORK_RESOURCES_INJECTOR_IMAGE": ("SriovOperatorConfig", ((("spec", "enableInjector"), False),)),
    "METRICS_EXPORTER_IMAGE": ("SriovOperatorConfig", ((("spec", "featureGates", "metricsExporter"), False),)),
    "METRICS_EXPORTER_KUBE_RBAC_PROXY_IMAGE": ("SriovOperatorConfig", ((("spec", "featureGates", "metricsExporter"), False),)),
    "SRIOV_DRA_DRIVER_IMAGE": ("SriovOperatorConfig", ((("spec", "featureGates", "dynamicResourceAllocation"), False),)),
    "DRIVER_MANAGER_IMAGE": ("ClusterPolicy", ((("spec", "driver", "enabled"), True),
                                             (("spec", "sandboxWorkloads", "enabled"), False))),
}
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod")


def images_named(objects: list[dict]) -> dict[str, str]:
    """image -> where: every container image of the workloads, and every image an operator is
    told through an *_IMAGE variable (it deploys those itself)."""
    found: dict[str, str] = {}

    def walk(node, owner: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("image"), str) and node.get("name"):
                found[node["image"]] = f"{owner} container {node['name']}"
            if str(node.get("name", "")).endswith("_IMAGE") and node.get("value"):
                found[str(node["value"])] = f"{owner} env {node['name']}"
            for value in node.values():
                walk(value, owner)
        elif isinstance(node, list):
            for value in node:
                walk(value, owner)

    for obj in objects:
        if obj.get("kind") in WORKLOADS:
            walk(obj.get("spec"), f"{obj['kind']} {obj['metadata']['name']}")
    return found


def left_off(objects: list[dict], variable: str) -> bool:
    kind, paths = IMAGES_FOR_FEATURES[variable]
    for obj in objects:
        if obj.get("kind") == kind:
            return not any(field(obj, path, default) for path, default in paths)
    return True  # no such object: nothing turns the feature on


def field(obj: dict, path: tuple[str, ...], default: bool):
    value = obj
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return default
        value = value[key]
    return value


def extract(git_dir: Path, tag: str, paths: list[str], into: Path) -> None:
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", tag, *paths], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


@pytest.fixture(scope="module")
def api(api, tmp_path_factory):
    """An API server of this module's own: the real charts' CRDs it installs differ from the
    doubles' that other modules apply to the session's server, and CRDs are cluster-wide, so
    sharing would make a module's result depend on which ran first."""
    server = ApiServer(tmp_path_factory.mktemp("api-dry-run"), api.bin_dir).start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["double", "real"])
def charts(request, tmp_path_factory) -> ChartSource:
    return ChartSource(request.param, tmp_path_factory.mktemp("upstream-charts"))


def helm_template(helm: Path, chart: Path, release: str, namespace: str, kube_version: str, values: str) -> list[dict]:
    proc = subprocess.run([str(helm), "template", release, str(chart), "--namespace", namespace,
                           "--kube-version", kube_version, "--include-crds", "--values", "-"],
                          input=values, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]



@dataclass
class ThroughRealChart:
    """An inventory's add-on as `gpuboot render` wrote it and NVIDIA's chart at the pinned tag
    turned its values into objects."""
    cluster: object
    release: object
    addon: Path       # the rendered add-on's folder on the first control plane
    namespace: str
    chart_name: str
    objects: list[dict]


def render_through_real_chart(inventory: Path, addon_name: str, matrix_key: str, helm: Path,
                              tmp_path: Path) -> ThroughRealChart:
    cluster = load_cluster(inventory)
    release = matrix.load(cluster.settings.release)
    assert run(["render", str(inventory), "--out", str(tmp_path / "render")]) == 0
    addon = tmp_path / "render" / cluster.first_control_plane / "etc" / "gpuboot" / "addons" / addon_name
    assert addon.is_dir(), f"{inventory}: no {addon_name} rendered"
    namespace = yaml.safe_load((addon / "namespace.yaml").read_text())["metadata"]["name"]
    pinned = release.model_extra[matrix_key]["chart"]
    chart = ChartSource("real", tmp_path / "charts").chart(pinned["name"], str(pinned["version"]), release.name)
    objects = helm_template(helm, chart, pinned["name"], namespace, release.kubernetes.version,
                            (addon / "values.yaml").read_text())
    return ThroughRealChart(cluster, release, addon, namespace, pinned["name"], objects)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_addon_object_passes_a_server_side_dry_run(case, charts, api, helm, tmp_path):
    inventory = CASES[case]
    if callable(inventory):
        inventory = inventory(tmp_path / "inventory")
    assert run(["render", str(inventory), "--out", str(tmp_path)]) == 0
    cluster = load_cluster(inventory)
    release = matrix.load(cluster.settings.release)
    kube_version = release.kubernetes.version
    first = cluster.first_control_plane
    addons = tmp_path / first / "etc" / "gpuboot" / "addons"
    checked, custom, named, dropped = 0, [], {}, {}
    for name, (chart, namespace, before, after) in ADDONS.items():
        directory = addons / name
        if not directory.is_dir() or not charts.has(chart):
            continue
        pinned = (release.model_extra or {})[name.replace("-", "_")]
        values = (directory / "values.yaml").read_text()
        if charts.kind == "real":
            # helm ignores a key its chart does not have: held against the real chart's own keys.
            unknown = unknown_keys(chart, str(pinned["chart"]["version"]), release.name, yaml.safe_load(values))
            assert not unknown, (f"{case}/{name}: values the real chart {chart} {pinned['chart']['version']} does "
                                 f"not have (values.yaml, a subchart's, a template's): {unknown}")
        objects = helm_template(helm, charts.chart(chart, pinned["chart"]["version"], release.name), chart, namespace,
                                kube_version, values)
        # An add-on whose CRDs are a chart of their own (Calico from v3.32) renders it first, as the phase does.
        crd_chart = pinned.get("crd_chart")
        if crd_chart:
            objects = helm_template(helm, charts.chart(crd_chart["name"], crd_chart["version"], release.name),
                                    f"{chart}-crds", namespace, kube_version, "") + objects
        crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
        policies = [d for file in after if (directory / file).is_file()
                    for d in yaml.safe_load_all((directory / file).read_text()) if d]
        crds += charts.runtime_crds(chart, pinned["chart"]["version"], release.name, policies)
        api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=yaml.safe_dump_all(crds))
        api.established(*sorted({crd["metadata"]["name"] for crd in crds}))
        namespace_file = (directory / "namespace.yaml").read_text()
        api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=namespace_file)
        documents = []
        for file in before[1:] + after:
            if (directory / file).is_file():
                documents += [d for d in yaml.safe_load_all((directory / file).read_text()) if d]
        # What the phase applies of the chart: its hooks sorted as a sync runs them
        # (playbooks/filter_plugins/chart_hooks.py; a hook name it does not know fails here).
        # Namespaced objects whose templates name no namespace go to the release's, as the phase
        # puts them (playbooks/filter_plugins/chart_namespace.py).
        parts = chart_hooks.chart_hook_split(chart_namespace.chart_namespaced(objects, namespace))
        if charts.kind == "real":
            applied = parts["crds"] + parts["before"] + parts["chart"] + parts["after"]
            never = [o["metadata"]["name"] for o in applied
                     if chart_hooks.hook_names(o) and not chart_hooks.hook_names(o) & (chart_hooks.BEFORE | chart_hooks.AFTER)]
            assert not never, f"{case}/{name}: delete, rollback or test hooks applied: {never}"
            dropped[name] = {o["metadata"]["name"] for o in parts["dropped"]}
        documents += parts["before"] + parts["chart"] + parts["after"]
        for image, where in images_named(objects).items():
            variable = where.rsplit(" ", 1)[-1]
            if variable not in IMAGES_FOR_FEATURES or not left_off(objects, variable):
                named[image] = f"{name}: {where}"
        kinds = {crd["spec"]["names"]["kind"] for crd in crds}
        custom += [d for d in documents if d["kind"] in kinds and isinstance(d.get("spec"), dict)]
        # One dry run for the add-on's objects: kubectl goes on past an object the server refuses
        # and names each refused one (kind, name, namespace, the server's reason) on stderr.
        proc = api.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=gpuboot", "-f", "-",
                           "-o", "json", stdin=yaml.safe_dump_all(documents), check=False)
        assert proc.returncode == 0, f"{case}/{name}: {proc.stderr}"
        answered = json.loads(proc.stdout)
        answered = answered["items"] if answered.get("kind") == "List" else [answered]
        # ...and every object came back from the server: none was dropped on the way...
        assert len(answered) == len(documents), (case, name, [o["metadata"]["name"] for o in answered])
        # ...and none landed in `default`, where kubectl puts a namespaced object that names no
        # namespace: its pods would find neither their ServiceAccount nor their ConfigMaps.
        stray = [f"{o['kind']}/{o['metadata']['name']}" for o in answered if o["metadata"].get("namespace") == "default"]
        assert not stray, f"{case}/{name}: objects in the default namespace: {stray}"
        checked += len(documents)
    assert checked > 0
    if charts.kind == "real":
        # NFD's post-delete prune Job (on by default in the GPU Operator's NFD subchart) strips
        # the NFD labels the operator selects its nodes by: never applied.
        if "gpu-operator" in dropped:
            assert any(n.endswith("-prune") for n in dropped["gpu-operator"]), (case, sorted(dropped["gpu-operator"]))
        # The real CRDs judge strictly: a field one does not know fails the dry run, so a key
        # gpuboot invented in a custom resource would have failed above.
        for document in custom:
            planted = {**document, "spec": {**document["spec"], "gpubootPlanted": True}}
            proc = api.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=gpuboot", "-f", "-",
                               stdin=yaml.safe_dump(planted), check=False)
            assert proc.returncode != 0 and "gpubootPlanted" in proc.stderr, (planted["kind"], proc.stderr)
        # Every image the real charts run or hand to their operators is one the mirror holds: in
        # an air gap a missing one is an ImagePullBackOff on the customer's nodes.
        planned = {str(image.ref) for image in build(release, Target.of(cluster, release)).images}
        missing = sorted(f"{image} ({where})" for image, where in named.items() if image not in planned)
        assert not missing, f"{case}: the real charts name images the mirror plan lacks: {missing}"
        # Without GPU nodes the Network Operator's chart runs the cluster's NFD, on the planned image.
        nfd = release.images["network_operator"]["nfd"]
        assert (nfd in named) is (case == "nic-only"), (case, sorted(named))
        print(f"{case}: hooks never applied: {({a: sorted(n) for a, n in dropped.items()})}")
        print(f"{case}: {checked} objects; the real CRDs judged {sorted({d['kind'] for d in custom})}; "
              f"{len(named)} images named, all planned")
