"""An add-on is declared once: its phase's catalog entry names the role (`addon=`), and the rest
is read from the role and the playbook: its directory from `<role>_dir`, its Helm release from
the playbook's include of tasks/install_chart.yml, its chart from the release matrix. The GitOps
repository's add-ons and the phases' results are derived from that, never restated."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuboot import matrix
from gpuboot.gitops import repo
from gpuboot.phases import catalog

ROOT = Path(__file__).resolve().parents[2]
RELEASES = sorted(p.stem for p in (ROOT / "mirror" / "releases").glob("*.yml"))


def test_gitops_addons_are_the_catalog_s_addon_phases_in_up_order():
    assert [a.phase for a in repo.ADDONS] == [p.name for p in catalog.UP if p.addon]
    assert {a.phase for a in repo.ADDONS} == {"cni", "network_operator", "gpu_operator"}


@pytest.mark.parametrize("phase", [p for p in catalog.UP if p.addon], ids=lambda p: p.name)
def test_an_addon_phase_s_facts_come_from_its_role_and_playbook(phase):
    addon = repo.Addon.of(phase)
    assert phase.addon in phase.roles, f"{phase.playbook} does not apply its add-on role {phase.addon}"
    # The release is what the playbook passes to install_chart.yml, the directory the role's own.
    text = (ROOT / "playbooks" / phase.playbook).read_text()
    tasks = "".join(p.read_text() for p in (ROOT / "playbooks" / "tasks").glob("*.yml"))
    assert f"chart_install_release: {addon.release}" in text + tasks
    assert f"{phase.addon}_dir: {catalog.addon_directory(phase.addon)}" in (
        ROOT / "roles" / phase.addon / "defaults" / "main.yml").read_text()
    for release in RELEASES:
        assert matrix.entry(release)[addon.chart]["chart"]["name"], (release, addon.chart)


@pytest.mark.parametrize("phase", [p for p in catalog.UP if p.addon and not callable(p.result)], ids=lambda p: p.name)
def test_an_addon_phase_s_result_is_its_role_s_directory(phase):
    assert phase.result.files == catalog.addon_files(phase.addon)


def test_the_release_follows_includes_into_task_files(tmp_path, monkeypatch):
    (tmp_path / "playbooks" / "tasks").mkdir(parents=True)
    (tmp_path / "playbooks" / "tasks" / "install_chart.yml").write_text("[]\n")
    (tmp_path / "playbooks" / "tasks" / "apply.yml").write_text(
        "- name: chart\n  ansible.builtin.include_tasks: install_chart.yml\n  vars:\n    chart_install_release: thing\n")
    (tmp_path / "playbooks" / "thing.yml").write_text(
        "- hosts: all\n  tasks:\n    - name: block\n      block:\n"
        "        - name: apply\n          ansible.builtin.include_tasks: tasks/apply.yml\n")
    (tmp_path / "playbooks" / "two.yml").write_text(
        "- hosts: all\n  tasks:\n"
        "    - {name: a, ansible.builtin.include_tasks: tasks/apply.yml}\n"
        "    - {name: b, ansible.builtin.include_tasks: x.yml, vars: {chart_install_release: other}}\n")
    (tmp_path / "playbooks" / "x.yml").write_text("[]\n")
    monkeypatch.setattr(catalog.content, "playbook", lambda name: tmp_path / "playbooks" / name)
    catalog.chart_release.cache_clear()
    try:
        assert catalog.chart_release("thing.yml") == "thing"
        with pytest.raises(ValueError, match="installs 2 chart releases"):
            catalog.chart_release("two.yml")
    finally:
        catalog.chart_release.cache_clear()


def test_an_addon_role_without_its_directory_is_named(tmp_path, monkeypatch):
    (tmp_path / "roles" / "thing" / "defaults").mkdir(parents=True)
    (tmp_path / "roles" / "thing" / "defaults" / "main.yml").write_text("thing_namespace: x\n")
    monkeypatch.setattr(catalog.content, "content_dir", lambda: tmp_path)
    catalog.addon_directory.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"roles/thing/defaults/main.yml: thing_dir"):
            catalog.addon_directory("thing")
    finally:
        catalog.addon_directory.cache_clear()
