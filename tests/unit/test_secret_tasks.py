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
