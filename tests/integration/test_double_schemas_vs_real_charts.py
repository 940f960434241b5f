"""Each chart double's values contract (tests/doubles/charts/*/values.schema.json, closed) against
the real chart's values at the version each release of the matrix pins, read from the upstream
repository's source tree where it is on this machine (a git directory, as `fetch` leaves it;
`GPUBOOT_UPSTREAM_SOURCES` names the folder, one `<owner>+<name>/repo` per repository).

A key the double accepts must be one the real chart has: in its values.yaml (or a subchart's),
under a key whose default is an open map, or read by its templates as `.Values.<path>`.
Otherwise gpuboot's values would pass the double and be ignored by the real chart, the wrong
assumption this test is here to catch. The keys the real chart has and the double leaves out
are listed in the test's output (`-rP`), for whoever widens the double."""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot_lab import LAB_RELEASE
from tests.support.chart_versions import schema_at

ROOT = Path(__file__).resolve().parents[2]
DOUBLES = ROOT / "tests" / "doubles" / "charts"
SOURCES = Path(os.environ.get("GPUBOOT_UPSTREAM_SOURCES", "/work/.mirror"))
TEMPLATE_REF = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
# A value a template renders whole (`toYaml .Values.x`, `.Values.x | toYaml`): the chart takes
# any key under it, and the API server judges them where they land (the real CRDs, in
# test_addon_objects_dry_run.py).
WHOLE_REF = re.compile(r"toYaml\s+\(?\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*\)?(?![.\w])"
                       r"|\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*\|\s*toYaml")


def template_refs(text: str, prefix: tuple[str, ...] = ()) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
    """(every values path a template names, with its parents; the paths it renders whole)."""
    named: set[tuple[str, ...]] = set()
    for ref in TEMPLATE_REF.findall(text):
        parts = (*prefix, *ref.lstrip(".").split("."))
        named |= {parts[:i] for i in range(1, len(parts) + 1)}
    whole = {(*prefix, *(a or b).lstrip(".").split(".")) for a, b in WHOLE_REF.findall(text)}
    return named, whole


@dataclass(frozen=True)
class Upstream:
    component: str  # the matrix's key
    repository: str  # owner+name under SOURCES
    chart_dir: str
    tag: str  # format of the git tag for a chart version
    # Values the chart's templates pass whole into a custom resource's spec (`omit .Values.x
    # "enabled" | toYaml`): their keys are held against that CRD's schema (found by name at the
    # tag: in the chart up to Calico v3.31, in the CRD chart from v3.32).
    passthrough: tuple[tuple[str, str], ...] = ()
    key: str = "chart"  # the key of the matrix entry naming the chart (crd_chart: a CRDs' chart)


UPSTREAMS = {
    "gpu-operator": Upstream("gpu_operator", "NVIDIA+gpu-operator", "deployments/gpu-operator", "{version}"),
    "network-operator": Upstream("network_operator", "Mellanox+network-operator", "deployment/network-operator",
                                 "v{version}"),
    "tigera-operator": Upstream("calico", "projectcalico+calico", "charts/tigera-operator", "{version}", (
        ("installation", "installations.operator.tigera.io"),
        ("apiServer", "apiservers.operator.tigera.io"),
        ("goldmane", "goldmanes.operator.tigera.io"),
        ("whisker", "whiskers.operator.tigera.io"))),
    "crd.projectcalico.org.v1": Upstream("calico", "projectcalico+calico", "charts/crd.projectcalico.org.v1",
                                         "{version}", key="crd_chart"),
    "argo-cd": Upstream("argocd", "argoproj+argo-helm", "charts/argo-cd", "argo-cd-{version}"),
}


def schema_paths(schema: dict, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every key path the closed schema accepts, down to its leaves (an object without listed
    properties is a leaf: the double takes any map there)."""
    return crd_paths(schema, prefix)[0]


def crd_paths(schema: dict, prefix: tuple[str, ...]) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
    """(key paths, open maps) of an OpenAPI schema (a CRD's, or a chart's values schema) below
    `prefix`; the keys of a list's items are under "[]"."""
    paths: set[tuple[str, ...]] = set()
    open_maps: set[tuple[str, ...]] = set()
    for key, sub in (schema.get("properties") or {}).items():
        path = (*prefix, key)
        paths.add(path)
        items = sub.get("items") if isinstance(sub.get("items"), dict) else None
        target, where = (items, (*path, "[]")) if items is not None else (sub, path)
        if target.get("properties"):
            more, more_open = crd_paths(target, where)
            paths |= more
            open_maps |= more_open
        elif target.get("type") == "object" or target.get("x-kubernetes-preserve-unknown-fields"):
            open_maps.add(where)
    return paths, open_maps


def value_paths(values, prefix: tuple[str, ...] = ()) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
    """(every key path of a values tree, the paths whose default is an open map: empty or null)."""
    paths: set[tuple[str, ...]] = set()
    open_maps: set[tuple[str, ...]] = set()
    if not isinstance(values, dict):
        return paths, open_maps
    for key, sub in values.items():
        path = (*prefix, str(key))
        paths.add(path)
        if sub is None or sub == {} or sub == []:
            open_maps.add(path)
            if sub == []:
                open_maps.add((*path, "[]"))
        elif isinstance(sub, dict):
            more, more_open = value_paths(sub, path)
            paths |= more
            open_maps |= more_open
        elif isinstance(sub, list):  # the keys the listed items show
            for item in sub:
                more, more_open = value_paths(item, (*path, "[]"))
                paths |= more
                open_maps |= more_open
    return paths, open_maps


def git(git_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True)


def show(git_dir: Path, tag: str, path: str) -> str | None:
    """A file of the repository at `tag`, or None where it has none."""
    done = git(git_dir, "show", f"{tag}:{path}")
    return done.stdout if done.returncode == 0 else None


def source_tree(chart: str, version: str, release: str) -> tuple[Upstream, Path, str]:
    """(upstream, git directory, tag) of the chart at the version the release pins; skips where
    the source tree is not on this machine, fails where it lacks the tag."""
    upstream = UPSTREAMS[chart]
    git_dir = SOURCES / upstream.repository / "repo"
    if not git_dir.is_dir():
        pytest.skip(f"{upstream.repository.replace('+', '/')}'s source tree is not on this machine ({git_dir})")
    tag = upstream.tag.format(version=version)
    if git(git_dir, "rev-parse", "--verify", "-q", f"{tag}^{{commit}}").returncode != 0:
        pytest.fail(f"{release} pins {chart} {version}, but {upstream.repository.replace('+', '/')} has no tag {tag}")
    return upstream, git_dir, tag


class RealChart:
    """The chart's values, subcharts and template references at one git tag."""

    def __init__(self, git_dir: Path, tag: str, upstream: Upstream) -> None:
        self.git_dir, self.tag, self.chart_dir, self.upstream = git_dir, tag, upstream.chart_dir, upstream

    def _show(self, path: str) -> str | None:
        return show(self.git_dir, self.tag, path)

    def _files(self, under: str) -> list[str]:
        done = git(self.git_dir, "ls-tree", "-r", "--name-only", self.tag, under)
        done.check_returncode()
        return done.stdout.split()

    def known(self) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
        values = yaml.safe_load(self._show(f"{self.chart_dir}/values.yaml") or "") or {}
        paths, open_maps = value_paths(values)
        chart = yaml.safe_load(self._show(f"{self.chart_dir}/Chart.yaml") or "") or {}
        for dep in chart.get("dependencies") or []:
            name = dep.get("alias") or dep["name"]
            sub = yaml.safe_load(self._show(f"{self.chart_dir}/charts/{dep['name']}/values.yaml") or "null")
            if sub is None:
                open_maps.add((name,))  # the subchart is not in the tree: nothing to hold its keys against
                continue
            more, more_open = value_paths(sub, (name,))
            named, whole = self._template_refs(f"{self.chart_dir}/charts/{dep['name']}/templates", (name,))
            paths |= more | {(name,)} | named
            open_maps |= more_open | whole
        named, whole = self._template_refs(f"{self.chart_dir}/templates", ())
        paths |= named
        open_maps |= whole
        for key, crd_name in self.upstream.passthrough:
            found = real_crd(self.git_dir, self.tag, crd_name, self.chart_dir)
            assert found, f"{self.tag}: no CRD {crd_name} in the tree"
            spec = storage_schema(found[1])["properties"]["spec"]
            more, more_open = crd_paths(spec, (key,))
            paths |= more | {(key,)}
            open_maps |= more_open
            open_maps.discard((key,))  # its keys are the CRD's, not any
        return paths, open_maps

    def _template_refs(self, under: str, prefix: tuple[str, ...]) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
        named: set[tuple[str, ...]] = set()
        whole: set[tuple[str, ...]] = set()
        for path in self._files(under):
            more, more_whole = template_refs(self._show(path) or "", prefix)
            named, whole = named | more, whole | more_whole
        return named, whole


def lab_chart_version(chart: str) -> str:
    """The version of `chart` the lab's release pins."""
    return str(matrix.load(LAB_RELEASE).model_extra[UPSTREAMS[chart].component]["chart"]["version"])


@functools.cache
def known_keys(chart: str, version: str, release: str) -> tuple[frozenset, frozenset]:
    """(key paths, open maps) of the real chart at the version `release` pins, read once."""
    upstream, git_dir, tag = source_tree(chart, version, release)
    paths, open_maps = RealChart(git_dir, tag, upstream).known()
    assert len(paths) > 20, f"{chart} {tag}: the real chart's values did not read"
    return frozenset(paths), frozenset(open_maps)


def unknown_keys(chart: str, version: str, release: str, values: dict) -> list[str]:
    """The key paths of `values` the real chart at the pinned tag does not have: not in its
    values.yaml or a subchart's, not under an open map, not read by a template. helm ignores
    such a key; the operator never sees it."""
    paths, open_maps = known_keys(chart, version, release)
    return sorted(".".join(p) for p in value_paths(values)[0] if not accepted(p, paths, open_maps))


def storage_schema(crd: dict) -> dict:
    version = next((v for v in crd["spec"]["versions"] if v.get("storage")), crd["spec"]["versions"][0])
    return version["schema"]["openAPIV3Schema"]


def real_crd(git_dir: Path, tag: str, name: str, chart_dir: str) -> tuple[str, dict] | None:
    """(file, CRD) of the CustomResourceDefinition `name` in the repository at `tag`: the chart's
    own copy first, else the one the operator's manifests carry."""
    done = git(git_dir, "grep", "-l", "-F", f"name: {name}", tag, "--", "*.yaml", "*.yml")
    files = sorted((line.split(":", 1)[1] for line in done.stdout.split()), key=lambda f: not f.startswith(chart_dir))
    for path in files:
        try:
            docs = list(yaml.safe_load_all(show(git_dir, tag, path) or ""))
        except yaml.YAMLError:
            continue  # a template, not a manifest
        for doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition" \
                    and doc.get("metadata", {}).get("name") == name:
                return path, doc
    return None


def accepted(path: tuple[str, ...], paths: set[tuple[str, ...]], open_maps: set[tuple[str, ...]]) -> bool:
    return path in paths or any(path[:i] in open_maps for i in range(1, len(path)))


def releases_of(chart: str) -> list[tuple[str, str]]:
    """(chart version, first release naming it) for each distinct version the matrix pins."""
    seen: dict[str, str] = {}
    for name in matrix.available():
        body = (matrix.load(name).model_extra or {}).get(UPSTREAMS[chart].component) or {}
        version = (body.get(UPSTREAMS[chart].key) or {}).get("version")
        if version:
            seen.setdefault(str(version), name)
    return sorted(seen.items())


CASES = [(chart, version, release) for chart in sorted(UPSTREAMS) for version, release in releases_of(chart)]
# A CRDs' chart takes no values: its double has no values schema to hold.
VALUE_CASES = [case for case in CASES if (DOUBLES / case[0] / "values.schema.json").is_file()]


def double_crds(chart: str) -> list[Path]:
    """The CRD files of a chart double: its crds/, or its templates (a CRDs' chart)."""
    if (DOUBLES / chart / "crds").is_dir():
        return sorted((DOUBLES / chart / "crds").glob("*.yaml"))
    # Templates are read only for a chart without values (the others' are Helm templates).
    if (DOUBLES / chart / "values.schema.json").is_file():
        return []
    return sorted((DOUBLES / chart / "templates").glob("*.yaml"))


@pytest.mark.parametrize(("chart", "version", "release"), VALUE_CASES, ids=[f"{c}-{v}" for c, v, _ in VALUE_CASES])
def test_every_key_a_double_accepts_is_one_the_real_chart_has(chart, version, release):
    upstream, git_dir, tag = source_tree(chart, version, release)
    paths, open_maps = RealChart(git_dir, tag, upstream).known()
    assert len(paths) > 20, f"{chart} {tag}: the real chart's values did not read"
    double = schema_paths(schema_at(json.loads((DOUBLES / chart / "values.schema.json").read_text()), version))
    unknown = sorted(".".join(p) for p in double if not accepted(p, paths, open_maps))
    assert not unknown, (f"the {chart} double accepts keys the real chart {tag} does not have "
                         f"(values.yaml, a subchart or a template): {unknown}")
    left_out = sorted({p[0] for p in paths if len(p) == 1} - {p[0] for p in double})
    print(f"{chart} {tag} ({release}): the double holds {len(double)} of the real chart's {len(paths)} key paths; "
          f"top-level sections it leaves out: {', '.join(left_out) or 'none'}")


CRD_CASES = [case for case in CASES if double_crds(case[0])]


@pytest.mark.parametrize(("chart", "version", "release"), CRD_CASES, ids=[f"{c}-{v}" for c, v, _ in CRD_CASES])
def test_every_field_a_double_crd_accepts_is_one_the_real_crd_has(chart, version, release):
    """The custom resources gpuboot applies are held by the doubles' CRDs (strict server-side
    apply): each field they accept must be one the real CRD at the pinned tag has."""
    upstream, git_dir, tag = source_tree(chart, version, release)
    problems, compared = [], []
    for path in double_crds(chart):
        double = yaml.safe_load(path.read_text())
        name = double["metadata"]["name"]
        found = real_crd(git_dir, tag, name, upstream.chart_dir)
        if found is None:
            problems.append(f"{name}: no such CRD in {upstream.repository.replace('+', '/')} at {tag}")
            continue
        real_file, real = found
        # Where the CRD comes from matters: one the operator makes is not there until it
        # reconciles, so what gpuboot applies of that kind must wait for it.
        if not real_file.startswith(f"{upstream.chart_dir}/"):
            problems.append(f"{name}: the double chart carries it, the real one is in {real_file}")
            continue
        paths, open_maps = crd_paths(storage_schema(real)["properties"]["spec"], ("spec",))
        paths.add(("spec",))
        at_version = schema_at(storage_schema(double), version)
        wanted = {("spec", *p) for p in schema_paths(at_version["properties"]["spec"])}
        unknown = sorted(".".join(p) for p in wanted if not accepted(p, paths, open_maps))
        if unknown:
            problems.append(f"{name} (real: {real_file}): {unknown}")
        compared.append(f"{name} {len(wanted)} of {len(paths)} fields")
    assert not problems, f"the {chart} double's CRDs accept what the real ones at {tag} do not: {problems}"
    print(f"{chart} {tag} CRDs: " + "; ".join(compared))


def test_a_key_the_real_chart_lacks_is_caught(tmp_path):
    """The check fails for a key the real values and templates never name, accepts one under an
    open map, and reads a subchart's keys under its name."""
    paths, open_maps = value_paths({"driver": {"enabled": True, "env": [], "licensingConfig": {}},
                                    "nodeSelector": None})
    assert accepted(("driver", "enabled"), paths, open_maps)
    assert accepted(("driver", "licensingConfig", "secretName"), paths, open_maps)
    assert accepted(("nodeSelector", "role"), paths, open_maps)
    assert not accepted(("driver", "kernelModuleTypo"), paths, open_maps)
    assert not accepted(("cdi", "default"), paths, open_maps)
    schema = {"properties": {"driver": {"type": "object", "properties": {"enabled": {}, "version": {}}},
                             "labels": {"type": "object"}}}
    assert schema_paths(schema) == {("driver",), ("driver", "enabled"), ("driver", "version"), ("labels",)}
    # A value passed whole into a custom resource: its keys are the CRD's.
    crd = {"properties": {"registry": {"type": "string"},
                          "calicoNetwork": {"type": "object", "properties": {
                              "ipPools": {"type": "array", "items": {"type": "object", "properties": {"cidr": {}}}}}},
                          "nodeMetricsPort": {"type": "object"}}}
    paths, open_maps = crd_paths(crd, ("installation",))
    assert accepted(("installation", "calicoNetwork", "ipPools", "[]", "cidr"), paths, open_maps)
    assert accepted(("installation", "nodeMetricsPort", "anything"), paths, open_maps)
    assert not accepted(("installation", "calicoNetwork", "ipPool"), paths, open_maps)
    assert not accepted(("installation", "calicoNetwork", "ipPools", "[]", "cidrs"), paths, open_maps)
    # A value a template renders whole takes any key (seen: the GPU Operator's chart passes
    # validator.driver.env into the ClusterPolicy, though its values.yaml never names it).
    named, whole = template_refs("{{- if .Values.validator.driver.env }}\n"
                                 "env: {{ toYaml .Values.validator.driver.env | nindent 8 }}\n"
                                 "image: {{ .Values.validator.image }}\nx: {{ .Values.daemonsets.labels | toYaml }}")
    assert whole == {("validator", "driver", "env"), ("daemonsets", "labels")}
    assert ("validator", "image") in named and ("validator",) in named
    assert accepted(("validator", "driver", "env", "[]", "name"), named, whole)
    assert not accepted(("validator", "imag"), named, whole)


@pytest.mark.parametrize("chart", ["gpu-operator", "network-operator"])
def test_a_values_key_the_real_chart_lacks_is_found(chart):
    """What the add-on dry run holds gpuboot's values to (unknown_keys), at the version the lab's
    release pins: a key NVIDIA's chart never had, one it dropped (open kernel modules are
    driver.kernelModuleType now) and a misspelt one are found; the chart's own keys, a subchart's
    and keys under an open map are not."""
    version = lab_chart_version(chart)
    values = {"gpu-operator": {"driver": {"kernelModuleType": "open", "useOpenKernelModules": True,
                                          "upgradePolicy": {"maxParallelUpgrades": 1}},
                               "node-feature-discovery": {"worker": {"tolerations": []}},
                               "daemonsets": {"labels": {"team": "ml"}},
                               "toolkit": {"enviroment": []}},
              "network-operator": {"nfd": {"enabled": False}, "sriovNetworkOperator": {"enabled": True},
                                   "operator": {"repository": "r", "image": "i", "tolerations": []},
                                   "nfd.enabled": True, "sriov-network-operator": {"gpubootPlanted": True}}}[chart]
    unknown = unknown_keys(chart, version, LAB_RELEASE, values)
    expected = {"gpu-operator": ["driver.useOpenKernelModules", "toolkit.enviroment"],
                "network-operator": ["nfd.enabled", "sriov-network-operator.gpubootPlanted"]}[chart]
    assert unknown == expected, unknown
