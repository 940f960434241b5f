from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gpuboot.config.loader import load_cluster
from gpuboot.errors import UsageError
from gpuboot.phases.catalog import CATALOGS, UP, role_files
from gpuboot.phases.select import Selection, select

ROOT = Path(__file__).resolve().parents[2]
NAMES = [p.name for p in UP]


def test_catalog_order_is_the_documented_one():
    assert NAMES == ["mirror", "preflight", "os_prep", "container_runtime", "kube_packages", "ha_endpoint",
                     "control_plane_init", "control_plane_join", "kube_vip", "workers_join", "cni", "gpu_operator",
                     "network_operator", "validate", "gitops_handoff"]


EVERY_PHASE = list(dict.fromkeys(p for catalog in CATALOGS.values() for p in catalog))


@pytest.mark.parametrize("phase", EVERY_PHASE, ids=[p.name for p in EVERY_PHASE])
def test_every_phase_playbook_exists_and_targets_its_hosts(phase):
    plays = yaml.safe_load(phase.path.read_text())
    assert plays, phase.path
    # The playbook states the hosts once; the phase's hosts are its plays' patterns.
    assert phase.host_patterns == tuple(dict.fromkeys(play["hosts"] for play in plays))
    for play in plays:
        for task in play.get("tasks", []):
            assert task["name"].startswith(phase.name) or task["name"].split(" | ")[0], task


def test_phases_say_when_they_are_not_built_for_the_settings():
    by = {p.name: p for p in UP}
    cluster = load_cluster(ROOT / "inventories" / "sample" / "inventory.yml")
    settings = cluster.settings
    # Calico and the GPU Operator are built; what each leaves on the hosts follows the CNI.
    assert by["cni"].stops_because(settings) is None and by["gpu_operator"].stops_because(settings) is None
    bridge = settings.model_copy(update={"networking": settings.networking.model_copy(update={"cni": "bridge"})})
    assert by["cni"].stops_because(bridge) is None
    assert by["cni"].result_for(settings).present == ("/etc/cni/net.d/10-calico.conflist",)
    assert "gpuboot-pod-routes" in by["cni"].result_for(bridge).services
    kube_vip = settings.model_copy(update={"control_plane": settings.control_plane.model_copy(update={"mode": "kube_vip"})})
    # The VIP is keepalived's or kube-vip's: the other phase has nothing to do.
    with_kube_vip = cluster.model_copy(update={"settings": kube_vip})
    assert by["ha_endpoint"].idle(with_kube_vip) == "control_plane.mode is kube_vip: no keepalived or haproxy"
    assert by["kube_vip"].idle(with_kube_vip) is None and by["kube_vip"].stops_because(kube_vip) is None
    assert by["kube_vip"].pulls_for(with_kube_vip) == ("kube_vip",)
    assert by["control_plane_init"].pulls_for(with_kube_vip) == ("kubernetes", "kube_vip")
    assert by["kube_vip"].idle(cluster) == "control_plane.mode is keepalived_haproxy"
    assert by["control_plane_init"].pulls_for(cluster) == ("kubernetes",)
    assert by["ha_endpoint"].idle(cluster) is None and by["ha_endpoint"].stops_because(settings) is None
    # The handoff pushes with the deploy key and checks the Git server's host key: both named.
    assert by["gitops_handoff"].stops_because(settings) is None
    gitops = settings.gitops
    no_host_key = settings.model_copy(update={"gitops": gitops.model_copy(update={"known_hosts_file": None})})
    assert by["gitops_handoff"].stops_because(no_host_key).startswith("gpuboot.gitops.known_hosts_file not set")
    bare = settings.model_copy(update={"gitops": gitops.model_copy(update={"known_hosts_file": None,
                                                                            "credentials_file": None})})
    assert "credentials_file and gpuboot.gitops.known_hosts_file" in by["gitops_handoff"].stops_because(bare)
    https = settings.model_copy(update={"gitops": gitops.model_copy(update={"repo_url": "https://git.example/x.git"})})
    assert "SSH deploy key" in by["gitops_handoff"].stops_because(https)


def test_phase_roles_come_from_its_playbook():
    by = {p.name: p for p in UP}
    assert by["container_runtime"].roles == ("package_source", "container_runtime")
    assert by["kube_packages"].roles == ("kube_packages",)
    assert by["control_plane_join"].roles == ("kubeadm_join", "kube_vip")
    assert by["kube_vip"].roles == ("kube_vip",)
    assert "bridge_cni" in by["cni"].roles


def test_unbuilt_phases_say_so_and_fail_loudly():
    unbuilt = [p for p in UP if not p.implemented]
    assert {p.name for p in UP if p.implemented} >= {"preflight", "os_prep"}
    for phase in unbuilt:
        play = yaml.safe_load(phase.path.read_text())[0]
        tasks = play.get("tasks", []) + play.get("post_tasks", [])
        assert any("ansible.builtin.fail" in t and ("not implemented" in t["ansible.builtin.fail"]["msg"]
                                                   or "not built yet" in t["ansible.builtin.fail"]["msg"]) for t in tasks)


def test_selection_ranges_only_and_skip():
    assert [p.name for p in select(UP, Selection(to_phase="os_prep"))] == ["mirror", "preflight", "os_prep"]
    assert [p.name for p in select(UP, Selection(from_phase="validate"))] == ["validate", "gitops_handoff"]
    assert [p.name for p in select(UP, Selection(only=("cni", "preflight")))] == ["preflight", "cni"]
    got = [p.name for p in select(UP, Selection(to_phase="kube_packages", skip=("os_prep",)))]
    assert got == ["mirror", "preflight", "container_runtime", "kube_packages"]


@pytest.mark.parametrize("sel, message", [
    (Selection(from_phase="prefligth"), "did you mean preflight"),
    (Selection(from_phase="cni", to_phase="preflight"), "comes after"),
    (Selection(only=("cni",), from_phase="preflight"), "cannot be combined"),
    (Selection(only=("cni",), skip=("cni",)), "no phase left"),
])
def test_bad_selection_is_a_usage_error(sel, message):
    with pytest.raises(UsageError) as info:
        select(UP, sel)
    assert message in str(info.value)


def test_host_patterns_resolve_like_ansible():
    cluster = load_cluster(ROOT / "inventories" / "sample" / "inventory.yml")
    assert cluster.hosts_matching("control_plane[0]") == ["cp01"]
    assert cluster.hosts_matching("control_plane[1:]") == ["cp02", "cp03"]
    assert cluster.hosts_matching("control_plane:workers") == ["cp01", "cp02", "cp03", "cpu01", "gpu01", "gpu02"]


def test_phases_with_nothing_to_do_are_skipped_and_pull_nothing(tmp_path):
    # The sample has GPU workers, NICs and gitops: every add-on phase has work.
    sample = load_cluster(ROOT / "inventories" / "sample" / "inventory.yml")
    by = {p.name: p for p in UP}
    assert all(by[name].idle(sample) is None for name in ("gpu_operator", "network_operator", "gitops_handoff"))
    # The same site without GPU workers, NICs and gitops: those phases are idle and pull nothing.
    shutil.copytree(ROOT / "inventories" / "sample", tmp_path / "site")
    inventory = tmp_path / "site" / "inventory.yml"
    data = yaml.safe_load(inventory.read_text())
    workers = data["all"]["children"]["workers"]
    workers.pop("children", None)
    workers["hosts"] = {"cpu01": {"ansible_host": "10.20.0.50"}}
    inventory.write_text(yaml.safe_dump(data))
    settings = tmp_path / "site" / "group_vars" / "all.yml"
    text = yaml.safe_load(settings.read_text())
    text["gpuboot"].pop("gitops", None)
    text["gpuboot"].pop("tenants", None)
    settings.write_text(yaml.safe_dump(text))
    cluster = load_cluster(inventory)
    assert by["gpu_operator"].idle(cluster) == "the inventory has no gpu_workers"
    assert by["network_operator"].idle(cluster) == "no node declares fabric NICs (RDMA or SR-IOV)"
    assert by["gitops_handoff"].idle(cluster) == "gpuboot.gitops is not set"
    assert by["gpu_operator"].pulls_for(cluster) == () and by["validate"].pulls_for(cluster) == ("validate",)


def test_each_plays_pattern_is_resolved_on_its_own():
    """reset's workers play excludes the control planes; its next play takes them: joined
    into one pattern, the exclusion would drop them from the lock, the probe and the count."""
    from gpuboot.config.loader import load_cluster
    from gpuboot.phases.catalog import RESET
    cluster = load_cluster(ROOT / "inventories" / "sample" / "inventory.yml")
    assert RESET[0].host_patterns == ("workers:!control_plane", "control_plane[1:]:control_plane[0]")
    assert RESET[0].hosts_in(cluster) == ["cpu01", "gpu01", "gpu02", "cp02", "cp03", "cp01"]


def test_results_name_the_files_each_role_lists_once():
    """A phase's result reads its roles' file lists (what their tasks write and render shows):
    the catalog never restates a role's paths."""
    by = {p.name: p for p in UP}
    assert by["ha_endpoint"].result_for(None).files == ("/etc/haproxy/haproxy.cfg", "/etc/keepalived/keepalived.conf")
    assert by["kube_vip"].result_for(None).files == ("/etc/kubernetes/manifests/kube-vip.yaml",)
    # A file written per loop item is a glob; a role's own settings are resolved in its paths.
    assert by["container_runtime"].result_for(None).files[:2] == (
        "/etc/containerd/config.toml", "/etc/containerd/certs.d/*/hosts.toml")
    assert set(role_files("os_prep")) <= set(by["os_prep"].result_for(None).files)
    source = (ROOT / "bootstrap" / "gpuboot" / "phases" / "catalog.py").read_text()
    for role in ("ha_endpoint", "kube_vip", "os_prep", "container_runtime"):
        for path in role_files(role):
            assert f'"{path}"' not in source, f"catalog.py restates {role}'s {path}"


def test_a_role_path_that_is_not_the_roles_own_literal_setting_is_refused(tmp_path, monkeypatch):
    role = tmp_path / "roles" / "odd"
    (role / "vars").mkdir(parents=True)
    (role / "vars" / "main.yml").write_text("odd_dir: \"{{ gpuboot_settings.x }}\"\n"
                                            "odd_files: {a: {src: a.j2, dest: '{{ odd_dir }}/a'}}\n")
    monkeypatch.setattr("gpuboot.content.content_dir", lambda: tmp_path)
    with pytest.raises(ValueError, match="more than the role's own literal settings"):
        role_files.__wrapped__("odd")
