"""`gpuboot plan --check` runs every phase in Ansible's check mode. There a command, shell, raw,
script or uri task is skipped unless it says `check_mode: false`, and whatever reads its
registered result then fails on an undefined attribute. So every read (a task that declares
`changed_when: false`, or a uri GET) must run in check mode too, itself or through its block,
or say in its `when` what a dry run does instead. The lab proof is the handoff module's `plan --check` through every phase
(tests/integration/test_lab_gitops.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# Modules that check mode skips (no check-mode support, or only through creates/removes).
SKIPPED_IN_CHECK_MODE = {f"ansible.builtin.{name}" for name in ("command", "shell", "raw", "script", "uri")}
CONTAINERS = ("block", "rescue", "always")
PLAY_SECTIONS = ("pre_tasks", "tasks", "post_tasks", "handlers")


def task_files() -> list[Path]:
    # (Handlers left out: check mode notifies them only for a change it did not make, and no
    # task reads what a handler registered.)
    return sorted([*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("playbooks/*.yml"),
                   *ROOT.glob("playbooks/tasks/*.yml")])


def tasks(node, inherited: dict | None = None) -> list[dict]:
    """Every task in a task file or playbook, blocks opened; a task takes its block's check_mode."""
    inherited = inherited or {}
    if isinstance(node, list):
        return [task for item in node for task in tasks(item, inherited)]
    if not isinstance(node, dict):
        return []
    if "check_mode" in node:
        inherited = {**inherited, "check_mode": node["check_mode"]}
    if any(key in node for key in CONTAINERS):
        return [task for key in CONTAINERS for task in tasks(node.get(key) or [], inherited)]
    if "hosts" in node:
        return [task for key in PLAY_SECTIONS for task in tasks(node.get(key) or [], inherited)]
    return [{**inherited, **node}]


def module_of(task: dict) -> str | None:
    return next((key for key in task if key.startswith("ansible.builtin.")), None)


def when_text(task: dict) -> str:
    when = task.get("when", "")
    return " ".join(map(str, when)) if isinstance(when, list) else str(when)


def is_read(task: dict) -> bool:
    module = module_of(task)
    if module not in SKIPPED_IN_CHECK_MODE:
        return False
    if module == "ansible.builtin.uri" and isinstance(task[module], dict):
        if str(task[module].get("method", "GET")).upper() in ("GET", "HEAD"):
            return True
    return task.get("changed_when") is False


def unready_reads(path: Path) -> list[str]:
    return [task.get("name", "?") for task in tasks(yaml.safe_load(path.read_text()) or [])
            if is_read(task) and task.get("check_mode") is not False and "ansible_check_mode" not in when_text(task)]


def test_the_scan_sees_the_tasks_it_must():
    # A scan that finds no reads at all would pass every file: it must see the known ones.
    reads = [task for path in task_files() for task in tasks(yaml.safe_load(path.read_text()) or [])
             if is_read(task)]
    assert len(reads) >= 33
    planted = yaml.safe_load("""
- name: a block
  block:
    - name: X | read something
      ansible.builtin.command: [kubectl, get, nodes]
      changed_when: false
    - name: X | read a URL
      ansible.builtin.uri:
        url: https://mirror.example:5000/v2/
    - name: X | post to a URL
      ansible.builtin.uri:
        url: https://mirror.example:5000/v2/
        method: POST
- name: a block that reads in check mode
  check_mode: false
  block:
    - name: X | read a URL in a dry run too
      ansible.builtin.uri:
        url: https://mirror.example:5000/v2/
""")
    assert [task["name"] for task in tasks(planted) if is_read(task)] == [
        "X | read something", "X | read a URL", "X | read a URL in a dry run too"]
    assert [task["check_mode"] for task in tasks(planted) if "check_mode" in task] == [False]


@pytest.mark.parametrize("path", task_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_read_runs_in_check_mode(path: Path):
    missing = unready_reads(path)
    assert not missing, (f"{path.relative_to(ROOT)}: these reads are skipped by `plan --check`, so what "
                         f"reads their result fails there; add `check_mode: false`: {missing}")


def test_the_gate_reports_nothing_in_a_dry_run():
    # gpuboot_cluster_check writes smoke Jobs, so check mode skips it: its report and its stop
    # must not read a result that a dry run never made.
    plays = yaml.safe_load((ROOT / "playbooks/validate.yml").read_text())
    after_check = [task for task in tasks(plays) if "validate_result" in yaml.safe_dump(task)
                   and "gpuboot_cluster_check" not in task]
    assert after_check
    for task in after_check:
        assert "not ansible_check_mode" in when_text(task), task["name"]
