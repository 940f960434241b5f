"""Every role task that writes a private key, a credential or a secret file hides it from
logs, diffs (plan --check runs with diff on) and the run's artifacts: no_log and diff: false."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# A variable that names a secret's content or file (a repository's public signing key is not one).
PUBLIC = re.compile(r"\b\w*_(?:apt|rpm)_key_file\b")
SECRET = re.compile(r"\b\w*(?:_key_file|_key_dest|_private_key\w*|_credentials\w*|_http_secret|_token\w*|_certificate_key\w*)\b")
WRITERS = {"ansible.builtin.copy", "ansible.builtin.template"}


def tasks():
    for file in sorted(ROOT.glob("roles/*/tasks/*.yml")):
        for task in yaml.safe_load(file.read_text()) or []:
            for inner in [task, *task.get("block", [])]:
                yield file, inner


def test_tasks_that_write_secrets_hide_them():
    exposed = []
    checked = 0
    for file, task in tasks():
        module = next((m for m in WRITERS if m in task), None)
        if module is None:
            continue
        text = yaml.safe_dump({module: task[module], "vars": task.get("vars", {})})
        if SECRET.search(PUBLIC.sub("", text)):
            checked += 1
            if task.get("no_log") is not True or task.get("diff") is not False:
                exposed.append(f"{file.relative_to(ROOT)}: {task.get('name')}")
    assert checked >= 2  # the registry's key and its configuration with the http secret at least
    assert not exposed, f"set no_log: true and diff: false on: {exposed}"


# A secret in a command line is in the process's argv: any local user of the node reads it in
# /proc while the command runs. Such commands take it from a 0600 file or from stdin instead.
ARGV_SECRET = re.compile(r"--(?:certificate-key|token|discovery-token|password)\b"
                         r"|\{\{[^}]*(?:certificate_key|_key_run|_token_run|\btoken\b|password)[^}]*\}\}")
RUNNERS = ("ansible.builtin.command", "ansible.builtin.shell")


def command_tasks():
    files = [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("playbooks/*.yml"), *ROOT.glob("playbooks/tasks/*.yml")]

    def walk(items):
        for item in items or []:
            if not isinstance(item, dict):
                continue
            yield item
            for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
                yield from walk(item.get(key))

    for file in sorted(files):
        for task in walk(yaml.safe_load(file.read_text())):
            module = next((m for m in RUNNERS if m in task), None)
            if module is not None:
                yield file, task, yaml.safe_dump({module: task[module], "vars": task.get("vars", {})})


def test_no_command_carries_a_secret_in_its_argv():
    scanned = list(command_tasks())
    found = [f"{file.relative_to(ROOT)}: {task.get('name')}" for file, task, text in scanned
             if ARGV_SECRET.search(text)]
    assert len(scanned) > 50  # the scan reaches the roles' and playbooks' commands
    assert not found, f"pass these secrets in a 0600 file or on stdin: {found}"


def test_the_argv_check_sees_a_certificate_key_on_the_command_line():
    text = yaml.safe_dump({"ansible.builtin.command": {"argv": [
        "kubeadm", "init", "phase", "upload-certs", "--certificate-key", "{{ kubeadm_join_key_run.stdout }}"]}})
    assert ARGV_SECRET.search(text)
    assert not ARGV_SECRET.search(yaml.safe_dump({"ansible.builtin.command": {"argv": [
        "kubeadm", "token", "create", "--ttl", "{{ kubeadm_join_token_ttl }}"]}}))
