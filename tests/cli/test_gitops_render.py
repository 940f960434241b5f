"""`gpuboot gitops render`: the repository Argo CD adopts the cluster from. Golden copies for the
sample and a four-tenant fleet (tests/golden/gitops/<case>); the add-ons' objects and values
are byte for byte what `gpuboot render` (and so `gpuboot up`) writes; each chart Application
renders with the release name, namespace, chart and version of the phase's install; nothing
gpuboot keeps (the mirror's login, Node labels) reaches the repository.
GPUBOOT_UPDATE_GOLDEN=1 rewrites the golden copies after a reviewed change."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.gitops.repo import ADDONS, KEPT_BY_GPUBOOT, MARKER
from tests.support.golden import matches_golden

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "gitops"
CASES = {
    "sample": ROOT / "inventories" / "sample" / "inventory.yml",
    "four-tenants": ROOT / "tests" / "fixtures" / "four-tenants" / "hosts.ini",
    "mixed-fleet": ROOT / "tests" / "fixtures" / "mixed-fleet" / "hosts.ini",
}
FAKE_LOGIN = "gitops-test-fake-password-5d1c"


def gitops_render(inventory: Path, out: Path) -> Path:
    assert run(["gitops", "render", str(inventory), "--out", str(out)]) == 0
    settings = load_cluster(inventory).settings
    return out / settings.gitops.directory(settings.cluster_name)


def with_gitops(inventory: Path, tmp_path: Path) -> Path:
    """A copy of an inventory directory with gpuboot.gitops set (mixed-fleet has none)."""
    copy = tmp_path / "inventory"
    shutil.copytree(inventory.parent, copy)
    all_vars = copy / "group_vars" / "all.yml"
    data = yaml.safe_load(all_vars.read_text())
    data["gpuboot"]["gitops"] = {"repo_url": "https://git.example.internal/platform/fleet.git"}
    all_vars.write_text(yaml.safe_dump(data))
    return copy / inventory.name


@pytest.mark.parametrize("case", ["sample", "four-tenants"])
def test_repository_matches_golden(case: str, tmp_path: Path):
    rendered = gitops_render(CASES[case], tmp_path / "repo")
    matches_golden(rendered, GOLDEN / case)


def _objects(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.mark.parametrize("case", ["sample", "mixed-fleet"])
def test_addons_are_what_up_applies(case: str, tmp_path: Path):
    inventory = CASES[case] if case == "sample" else with_gitops(CASES[case], tmp_path)
    repo = gitops_render(inventory, tmp_path / "repo")
    assert run(["render", str(inventory), "--out", str(tmp_path / "render")]) == 0
    cluster = load_cluster(inventory)
    first = tmp_path / "render" / cluster.first_control_plane
    playbooks = ROOT / "playbooks"
    seen = 0
    for addon in ADDONS:
        applied = first / "etc" / "gpuboot" / "addons" / addon.name
        base = repo / "addons" / addon.name / "base"
        if not applied.is_dir():
            assert not base.exists()
            continue
        seen += 1
        wanted = {p.name for p in applied.iterdir()} - KEPT_BY_GPUBOOT
        kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
        assert sorted(kustomization["resources"]) == sorted(wanted)
        for name in wanted:
            assert (base / name).read_text() == (applied / name).read_text(), f"{addon.name}/{name}"
        assert (repo / "addons" / addon.name / "values.yaml").read_text() == (applied / "values.yaml").read_text()
        # The Application renders the chart as the phase's `helm template` does.
        app = yaml.safe_load((repo / "argocd" / "applications" / f"addon-{addon.name}.yaml").read_text())
        *crds, chart, values, overlay = app["spec"]["sources"]
        install = _install_chart_vars(playbooks / f"{addon.phase}.yml")
        assert chart["helm"]["releaseName"] == install["chart_install_release"]
        entry = cluster.extravars()["gpuboot_release"][addon.chart]
        registry = cluster.settings.mirror.registry
        # The CRDs' own chart (Calico from v3.32) comes first, as the phase renders and applies it.
        assert len(crds) == (1 if entry.get("crd_chart") else 0)
        assert not entry.get("crd_chart") or "chart_install_crd_chart" in install
        for source, matrix_chart in zip([*crds, chart], [entry[k] for k in ("crd_chart", "chart") if entry.get(k)],
                                        strict=True):
            assert (source["chart"], source["targetRevision"]) == (matrix_chart["name"], str(matrix_chart["version"]))
            assert source["repoURL"] == (f"{registry}/charts" if registry else matrix_chart["repository"])
        namespace = [o for o in _objects((applied / "namespace.yaml").read_text()) if o["kind"] == "Namespace"]
        assert app["spec"]["destination"]["namespace"] == namespace[0]["metadata"]["name"]
        assert chart["helm"]["valueFiles"] == [f"$values/{repo.relative_to(tmp_path / 'repo')}/addons/{addon.name}/values.yaml"]
        assert values["ref"] == "values"
        assert overlay["path"].endswith(f"addons/{addon.name}/overlays/{cluster.settings.cluster_name}")
    assert seen >= 2


def _install_chart_vars(playbook: Path) -> dict:
    """The variables the phase hands tasks/install_chart.yml (directly, or through a tasks file
    of its own that includes it)."""
    found = _included(playbook.parent, [t for play in yaml.safe_load(playbook.read_text())
                                        for t in play.get("tasks") or []])
    if found is None:
        raise AssertionError(f"{playbook} does not include tasks/install_chart.yml")
    return found


def _included(playbooks: Path, tasks: list[dict]) -> dict | None:
    for task in tasks:
        for inner in [task, *(task.get("block") or [])]:
            target = inner.get("ansible.builtin.include_tasks")
            if target in ("tasks/install_chart.yml", "install_chart.yml"):
                return inner["vars"]
            if target:
                found = _included(playbooks, yaml.safe_load((playbooks / "tasks" / Path(target).name).read_text()))
                if found is not None:
                    return found
    return None


def test_secrets_and_gpuboots_own_objects_stay_out(tmp_path: Path):
    inventory = with_gitops(CASES["mixed-fleet"], tmp_path)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    login = secrets / "mirror.json"
    login.write_text(json.dumps({"username": "mirror-user", "password": FAKE_LOGIN}))
    login.chmod(0o600)
    all_vars = inventory.parent / "group_vars" / "all.yml"
    data = yaml.safe_load(all_vars.read_text())
    data["gpuboot"]["mirror"] = {"registry": "mirror.example.internal:5000", "credentials_file": str(login)}
    all_vars.write_text(yaml.safe_dump(data))
    # `up` writes the login into a Secret for the Network Operator: the repository must not.
    assert run(["render", str(inventory), "--out", str(tmp_path / "render")]) == 0
    repo = gitops_render(inventory, tmp_path / "repo")
    texts = {p: p.read_text() for p in repo.rglob("*") if p.is_file()}
    assert not [p for p, text in texts.items() if FAKE_LOGIN in text or "mirror-user" in text]
    assert not [p for p in texts if p.name in {"mirror-access.yaml", "node-labels.yaml"}]
    kinds = {o["kind"] for text in texts.values() for o in _objects(text) if isinstance(o, dict) and "kind" in o}
    assert "Secret" not in kinds and "Node" not in kinds


def test_a_tenant_removed_from_the_inventory_leaves_the_repository(tmp_path: Path):
    inventory = with_gitops(CASES["mixed-fleet"], tmp_path)
    all_vars = inventory.parent / "group_vars" / "all.yml"
    data = yaml.safe_load(all_vars.read_text())
    data["gpuboot"]["tenants"] = [{"name": "alpha", "quota": {"gpu": 4}}, {"name": "beta", "quota": {"gpu": 4}}]
    all_vars.write_text(yaml.safe_dump(data))
    repo = gitops_render(inventory, tmp_path / "repo")
    (tmp_path / "repo" / "README.md").write_text("the operator's own file\n")
    assert (repo / "tenants" / "beta").is_dir()
    data["gpuboot"]["tenants"] = data["gpuboot"]["tenants"][:1]
    all_vars.write_text(yaml.safe_dump(data))
    gitops_render(inventory, tmp_path / "repo")
    assert not (repo / "tenants" / "beta").exists()
    assert not (repo / "argocd" / "applications" / "tenant-beta.yaml").exists()
    assert "tenant-beta" not in (repo / "argocd" / "kustomization.yaml").read_text()
    assert (tmp_path / "repo" / "README.md").read_text() == "the operator's own file\n"  # outside gitops.path


def test_without_gitops_settings_it_says_what_to_set(tmp_path: Path, capsys):
    code = run(["gitops", "render", str(CASES["mixed-fleet"]), "--out", str(tmp_path / "repo")])
    assert code != 0
    err = capsys.readouterr().err
    assert "gpuboot.gitops is not set" in err and "repo_url" in err
    assert not (tmp_path / "repo").exists()


def test_every_kustomization_lists_files_that_exist(tmp_path: Path):
    """The structure every build relies on (tests/integration/test_gitops_tenants.py builds them
    for real with kubectl's kustomize)."""
    for case in ("sample", "four-tenants"):
        repo = gitops_render(CASES[case], tmp_path / case)
        files = {p for p in repo.rglob("*") if p.is_file()}
        listed = set()
        for kustomization in repo.rglob("kustomization.yaml"):
            for resource in yaml.safe_load(kustomization.read_text())["resources"]:
                target = (kustomization.parent / resource).resolve()
                assert target.exists(), f"{kustomization} lists {resource}"
                listed |= {target} if target.is_file() else {target / "kustomization.yaml"}
        unlisted = {p for p in files - listed if p.name not in ("kustomization.yaml", "values.yaml", MARKER)}
        assert not unlisted, f"files no kustomization takes: {sorted(map(str, unlisted))}"


def test_the_default_directory_is_the_clusters_own(tmp_path: Path):
    repo = gitops_render(with_gitops(CASES["mixed-fleet"], tmp_path), tmp_path / "repo")
    assert repo == tmp_path / "repo" / "clusters" / "fleet"
    app = yaml.safe_load((repo / "argocd" / "root.yaml").read_text())
    assert app["spec"]["source"]["path"] == "clusters/fleet/argocd"


def test_a_directory_gpuboot_did_not_write_for_this_cluster_is_left_alone(tmp_path: Path, capsys):
    inventory = with_gitops(CASES["mixed-fleet"], tmp_path)
    theirs = tmp_path / "repo" / "clusters" / "fleet"
    theirs.mkdir(parents=True)
    (theirs / "app.yaml").write_text("kind: ConfigMap\n")
    assert run(["gitops", "render", str(inventory), "--out", str(tmp_path / "repo")]) != 0
    err = capsys.readouterr().err
    assert "files gpuboot did not write" in err and "gpuboot.gitops.path" in err
    assert sorted(p.name for p in theirs.iterdir()) == ["app.yaml"]
    # Another cluster's directory (its marker names it) is refused the same way.
    (theirs / "app.yaml").unlink()
    (theirs / ".gpuboot-gitops.json").write_text('{"cluster": "other"}\n')
    (theirs / "x.yaml").write_text("kind: ConfigMap\n")
    assert run(["gitops", "render", str(inventory), "--out", str(tmp_path / "repo")]) != 0
    assert "cluster other's" in capsys.readouterr().err
    assert (theirs / "x.yaml").is_file()


def test_diff_says_what_it_needs_before_touching_git(tmp_path: Path, capsys):
    # No gitops at all, then gitops without the deploy key and host key: located, no Git contacted.
    assert run(["gitops", "diff", str(CASES["mixed-fleet"])]) == 2
    assert "gpuboot.gitops is not set" in capsys.readouterr().err
    assert run(["gitops", "diff", str(with_gitops(CASES["mixed-fleet"], tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "credentials_file and known_hosts_file" in err and "ssh-keyscan" in err


def _declarations(repo: Path) -> dict[tuple, list[str]]:
    """(kind, namespace, name) -> the files that declare it (kustomizations and values aside)."""
    found: dict[tuple, list[str]] = {}
    for path in sorted(repo.rglob("*.yaml")):
        if path.name in ("kustomization.yaml", "values.yaml"):
            continue
        for doc in _objects(path.read_text()):
            if isinstance(doc, dict) and "kind" in doc:
                meta = doc.get("metadata") or {}
                found.setdefault((doc["kind"], meta.get("namespace"), meta.get("name")), []).append(
                    str(path.relative_to(repo)))
    return found


def with_a_tenant_on_a_network_namespace(tmp_path: Path) -> Path:
    """The mixed fleet with GitOps and a tenant whose namespace is one the InfiniBand network
    attaches pods from (the network stack's namespace and the tenant's are the same)."""
    inventory = with_gitops(CASES["mixed-fleet"], tmp_path)
    all_vars = inventory.parent / "group_vars" / "all.yml"
    data = yaml.safe_load(all_vars.read_text())
    data["gpuboot"]["tenants"] = [{"name": "training", "quota": {"gpu": 16}}]
    all_vars.write_text(yaml.safe_dump(data))
    return inventory


@pytest.mark.parametrize("case", ["sample", "four-tenants", "mixed-fleet", "tenant-on-a-network-namespace"])
def test_every_object_in_the_repository_has_one_owner(case: str, tmp_path: Path):
    """Argo CD flags an object two Applications declare as a shared resource, and they fight
    over it: each object is declared once, in one Application's path."""
    if case == "mixed-fleet":
        inventory = with_gitops(CASES[case], tmp_path)
    elif case == "tenant-on-a-network-namespace":
        inventory = with_a_tenant_on_a_network_namespace(tmp_path)
    else:
        inventory = CASES[case]
    repo = gitops_render(inventory, tmp_path / "repo")
    declared = _declarations(repo)
    assert len(declared) > 10
    twice = {key: files for key, files in declared.items() if len(files) > 1}
    assert not twice
    if case == "tenant-on-a-network-namespace":
        assert declared[("Namespace", None, "training")] == ["tenants/training/namespace.yaml"]
        networks = (repo / "addons" / "network-operator" / "base" / "networks.yaml").read_text()
        assert networks.startswith("# Namespace training: the tenant bundle's")
        assert ("Namespace", None, "inference") in declared  # a network namespace no tenant owns stays
