"""The upgrade's uncordon (playbooks/tasks/upgrade_node.yml) believes only kubectl's
"uncordoned" line: `kubectl uncordon` exits 0 when its PATCH fails (seen in the lab: "unable to
uncordon node ...: unexpected EOF" while the API server behind the VIP restarted, and the node's
gate then found it still cordoned). The task itself, taken from the file, runs under the real
ansible-playbook against a kubectl double that answers as kubectl does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBECTL_DOUBLE = """#!/bin/sh
# kubectl TEST DOUBLE: fails its PATCH the first $FAILS times, printing what kubectl prints, exit 0.
count=$(cat "$STATE" 2>/dev/null || echo 0); count=$((count + 1)); echo "$count" > "$STATE"
node=$(eval echo \\${$#})
if [ "$count" -le "$FAILS" ]; then
  echo "error: unable to uncordon node \\"$node\\": Patch \\"https://10.0.0.1:8443/api/v1/nodes/$node\\": unexpected EOF" >&2
  exit 0
fi
echo "node/$node ${ANSWER:-uncordoned}"
"""


def uncordon_task(name: str = "Upgrade node | uncordon") -> dict:
    def walk(tasks):
        for task in tasks or []:
            if task.get("name") == name:
                return task
            for key in ("block", "rescue", "always"):
                found = walk(task.get(key))
                if found:
                    return found
        return None
    task = dict(walk(yaml.safe_load((ROOT / "playbooks" / "tasks" / "upgrade_node.yml").read_text())))
    task.pop("delegate_to")
    task["delay"] = 0  # the tries, not the waits between them
    return task


def run(tmp_path: Path, fails: int, answer: str = "uncordoned") -> tuple[subprocess.CompletedProcess[str], int]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(KUBECTL_DOUBLE)
    kubectl.chmod(0o755)
    state = tmp_path / "calls"
    playbook = tmp_path / "uncordon.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [uncordon_task()]}]))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", STATE=str(state), FAILS=str(fails), ANSWER=answer,
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", json.dumps({"gpuboot_admin_kubeconfig": "/dev/null",
                                             "ansible_python_interpreter": sys.executable}), str(playbook)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return done, int(state.read_text())


def recap(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("localhost") and "ok=" in line)


def test_a_patch_that_failed_behind_exit_0_is_tried_again_until_kubectl_says_uncordoned(tmp_path):
    done, calls = run(tmp_path, fails=2)
    assert done.returncode == 0, done.stdout[-3000:]
    assert calls == 3
    assert "changed=1" in recap(done.stdout)


def test_an_uncordon_that_never_takes_fails_with_kubectl_s_words(tmp_path):
    done, calls = run(tmp_path, fails=100)
    assert done.returncode != 0
    assert calls == uncordon_task()["retries"] + 1
    assert "unable to uncordon node" in done.stdout and "unexpected EOF" in done.stdout


def test_an_uncordoned_node_is_no_change(tmp_path):
    done, calls = run(tmp_path, fails=0, answer="already uncordoned")
    assert done.returncode == 0, done.stdout[-3000:]
    assert calls == 1
    assert "changed=0" in recap(done.stdout)
