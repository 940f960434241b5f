"""Cordon and uncordon (playbooks/tasks/cordon.yml, used by the upgrade before its drain and
after its kubelet restart, and by node removal) believe only kubectl's "cordoned"/"uncordoned"
line: kubectl's cordon, uncordon and drain exit 0 when their PATCH fails (seen in the lab:
"unable to uncordon node ...: unexpected EOF" while the API server behind the VIP restarted,
and the node's gate then found it still cordoned). The task file itself runs under the real
ansible-playbook against a kubectl double that answers as kubectl does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "playbooks" / "tasks" / "cordon.yml"
KUBECTL_DOUBLE = """#!/bin/sh
# kubectl TEST DOUBLE: `kubectl --kubeconfig K VERB NODE`. Fails its PATCH the first $FAILS
# times, printing what kubectl prints and exiting 0 as kubectl does; a node the API server does
# not know is refused with kubectl's words and exit 1.
[ "$#" -eq 4 ] && [ "$1" = --kubeconfig ] || { echo "kubectl double: unexpected arguments: $*" >&2; exit 2; }
verb=$3 node=$4
count=$(cat "$STATE" 2>/dev/null || echo 0); count=$((count + 1)); echo "$count" > "$STATE"
if [ -n "$ABSENT" ]; then
  echo "Error from server (NotFound): nodes \\"$node\\" not found" >&2
  exit 1
fi
if [ "$count" -le "$FAILS" ]; then
  echo "error: unable to $verb node \\"$node\\": Patch \\"https://10.0.0.1:8443/api/v1/nodes/$node\\": unexpected EOF" >&2
  exit 0
fi
echo "node/$node ${ALREADY:+already }${verb}ed"
"""


def run(tmp_path: Path, verb: str, fails: int = 0, already: bool = False, absent: bool = False,
        check: bool = False, **task_vars) -> tuple[subprocess.CompletedProcess[str], int]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(KUBECTL_DOUBLE)
    kubectl.chmod(0o755)
    state = tmp_path / "calls"
    # The tries, not the waits between them: a copy of the task file with delay 0 and
    # everything else as written.
    task_file = yaml.safe_load(TASKS.read_text())
    assert task_file[0]["delay"] == 5 and task_file[0]["retries"] == 12
    task_file[0]["delay"] = 0
    copy = tmp_path / "cordon-tasks.yml"
    copy.write_text(yaml.safe_dump(task_file))
    playbook = tmp_path / "cordon.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "the task file", "ansible.builtin.include_tasks": str(copy),
                   "vars": {"cordon_node": "gpu01", "cordon_verb": verb, "cordon_via": "localhost", **task_vars}},
                  # What a caller reads (the upgrade's rescue message): the fact the task file sets.
                  {"name": "what the caller reads", "ansible.builtin.debug": {"msg": "cordon_done={{ cordon_done }}"}}]}]))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", STATE=str(state), FAILS=str(fails),
               ALREADY="1" if already else "", ABSENT="1" if absent else "",
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", json.dumps({"gpuboot_admin_kubeconfig": "/dev/null", "groups": {},
                                             "ansible_python_interpreter": sys.executable}),
                           *(["--check"] if check else []), str(playbook)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return done, int(state.read_text()) if state.exists() else 0


def done_fact(output: str) -> str:
    """The cordon_done fact as the caller's task printed it."""
    return next(line.split("cordon_done=", 1)[1].strip().strip('"') for line in output.splitlines()
                if "cordon_done=" in line and "{{" not in line)


def recap(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("localhost") and "ok=" in line)


# (verb, how many patches fail behind exit 0, whether the verb must take) -> (tries, recap, done).
# A patch that failed is tried again until kubectl says it took; the rescue's uncordon tries
# too, never fails the play, and says whether it took (its message reads it).
RETRIED = {
    "cordon taken on the 3rd try": (("cordon", 2, True), (3, "changed=1", "True")),
    "uncordon taken on the 3rd try": (("uncordon", 2, True), (3, "changed=1", "True")),
    "the rescue's uncordon never taken": (("uncordon", 100, False), (13, "failed=0", "False")),
}


@pytest.mark.parametrize("case", sorted(RETRIED))
def test_a_patch_that_failed_behind_exit_0_is_tried_again_until_kubectl_says_it_took(tmp_path, case):
    (verb, fails, must), (tries, in_recap, took) = RETRIED[case]
    done, calls = run(tmp_path, verb, fails=fails, cordon_must=must)
    assert done.returncode == 0, done.stdout[-3000:]
    assert calls == tries
    assert in_recap in recap(done.stdout)
    assert done_fact(done.stdout) == took


@pytest.mark.parametrize("verb", ["cordon", "uncordon"])
def test_a_verb_that_never_takes_fails_with_kubectl_s_words(tmp_path, verb):
    done, calls = run(tmp_path, verb, fails=100)
    assert done.returncode != 0
    assert calls == 13  # the first try and 12 more
    assert f"unable to {verb} node" in done.stdout and "unexpected EOF" in done.stdout


@pytest.mark.parametrize("verb", ["cordon", "uncordon"])
def test_a_node_already_so_is_no_change(tmp_path, verb):
    done, calls = run(tmp_path, verb, already=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert calls == 1
    assert "changed=0" in recap(done.stdout)
    assert done_fact(done.stdout) == "True"


def test_an_unknown_node_fails_unless_its_absence_is_allowed(tmp_path):
    done, calls = run(tmp_path, "cordon", absent=True)
    assert done.returncode != 0 and calls == 13 and "not found" in done.stdout
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    done, calls = run(allowed, "cordon", absent=True, cordon_absent_ok=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert calls == 1 and "changed=0" in recap(done.stdout)


def test_check_mode_runs_no_kubectl_and_waits_for_nothing(tmp_path):
    done, calls = run(tmp_path, "cordon", check=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert calls == 0
    assert "failed=0" in recap(done.stdout) and "FAILED - RETRYING" not in done.stdout
