"""The GPU Operator phase waits for the MIG manager's layouts (roles/gpu_operator/tasks/ready.yml).
The ClusterPolicy's readiness does not include them: the MIG manager's DaemonSet is ready once
its pod runs, and its reconfigure (NVIDIA/mig-parted v0.15.0, pkg/mig/reconfigure) reports only
through the node's nvidia.com/mig.config.state; a layout that failed sets it to failed and gives
the GPU clients back, so the node has no MIG devices while the policy still says ready. The
block runs under the real ansible-playbook with the role's own vars against a kubectl double
that answers as kubectl does for `get nodes -l nvidia.com/mig.config -o jsonpath=...` (the lab
found that kubectl takes no comma-separated names and answers one named node as the object,
not a list)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "gpu_operator"
WAIT = "GPU Operator | wait for the MIG layouts"
# Answers one line per try from $ANSWERS (a JSON list; the last one repeats): node=state lines.
KUBECTL_DOUBLE = """#!/usr/bin/env python3
# kubectl TEST DOUBLE: `kubectl --kubeconfig K get nodes -l nvidia.com/mig.config -o JSONPATH`,
# answered as kubectl answers a list (a single named node would be the object, not a list).
import json, os, sys
args = sys.argv[1:]
assert args[:4] == ["--kubeconfig", "/dev/null", "get", "nodes"], args
assert args[4:7] == ["-l", "nvidia.com/mig.config", "-o"] and len(args) == 8, args
assert args[7].startswith("jsonpath={range .items[*]}") and "nvidia\\\\.com/mig\\\\.config\\\\.state" in args[7], args[7]
calls = int(open(os.environ["STATE"]).read()) if os.path.exists(os.environ["STATE"]) else 0
open(os.environ["STATE"], "w").write(str(calls + 1))
answers = json.loads(os.environ["ANSWERS"])
states = answers[min(calls, len(answers) - 1)]
sys.stdout.write("".join(f"{name}={state}\\n" for name, state in states.items()))
"""
# Each try's answer: the nodes that have the layout label, and their state ("" when unset).
PLAN = {"nodes": {
    "h100-01": {"labels": {"nvidia.com/device-plugin.config": "default", "nvidia.com/mig.config": "all-1g.10gb"}},
    "h100-02": {"labels": {"nvidia.com/device-plugin.config": "default", "nvidia.com/mig.config": "all-3g.40gb"}},
    "l40s-01": {"labels": {"nvidia.com/device-plugin.config": "time-sliced-4"}},
}}


def run(tmp_path: Path, answers: list[dict[str, str]], plan: dict = PLAN) -> tuple[subprocess.CompletedProcess[str], int]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(KUBECTL_DOUBLE)
    kubectl.chmod(0o755)
    # The block as the role has it, with no wait between tries.
    block = next(t for t in yaml.safe_load((ROLE / "tasks" / "ready.yml").read_text()) if t.get("name") == WAIT)
    assert block["block"][0]["delay"] == 5
    block["block"][0]["delay"] = 0
    tasks = tmp_path / "wait.yml"
    tasks.write_text(yaml.safe_dump([block]))
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False, "vars_files": [str(ROLE / "vars" / "main.yml")],
        "vars": {"gpu_operator_plan": plan, "gpu_operator_kubeconfig": "/dev/null", "gpu_operator_ready_timeout": 20,
                 "gpu_operator_namespace": "gpu-operator", "gpu_operator_dir": str(tmp_path)},
        "tasks": [{"name": "the wait", "ansible.builtin.include_tasks": str(tasks)}]}]))
    state = tmp_path / "calls"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", STATE=str(state), ANSWERS=json.dumps(answers),
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", json.dumps({"ansible_python_interpreter": sys.executable}), str(playbook)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return done, int(state.read_text()) if state.exists() else 0


# a100-09 is not gpuboot's MIG node (the operator labels MIG-capable nodes all-disabled): it is
# not waited for, and its failing does not stop the wait for gpuboot's.
@pytest.mark.parametrize("answers", [
    [{"h100-01": "pending", "h100-02": ""}, {"h100-01": "success", "h100-02": "pending"},
     {"a100-09": "pending", "h100-01": "success", "h100-02": "success"}],
    [{"a100-09": "failed", "h100-01": "pending", "h100-02": "success"},
     {"a100-09": "failed", "h100-01": "success", "h100-02": "success"}],
], ids=["another node pending", "another node failed"])
def test_the_wait_ends_when_every_node_gpuboot_gave_a_layout_says_success(tmp_path, answers):
    done, calls = run(tmp_path, answers)
    assert done.returncode == 0, done.stdout[-3000:]
    assert calls == len(answers)


def test_a_failed_layout_stops_the_wait_at_once_naming_the_node_its_layout_and_where_to_look(tmp_path):
    done, calls = run(tmp_path, [{"h100-01": "success", "h100-02": "failed"}])
    assert done.returncode != 0
    assert calls == 1
    said = done.stdout
    assert "on 1 node(s)" in said and "h100-02: nvidia.com/mig.config=all-3g.40gb, state failed" in said, said[-3000:]
    assert "app=nvidia-mig-manager --field-selector spec.nodeName=h100-02" in said and "h100-01:" not in said


def test_a_layout_never_applied_is_named_after_the_timeout(tmp_path):
    done, calls = run(tmp_path, [{"h100-01": "success", "h100-02": ""}])
    assert done.returncode != 0
    assert calls == 5  # 20 s at 5 s a try: the first try and 4 more
    assert "h100-02: nvidia.com/mig.config=all-3g.40gb, state not set" in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize("nodes", [{"l40s-01": PLAN["nodes"]["l40s-01"]}, {"gpu01": {}, "gpu02": {"labels": {}}}],
                         ids=["time-sliced only", "nodes given no labels"])
def test_no_mig_node_no_wait(tmp_path, nodes):
    done, calls = run(tmp_path, [{}], plan={"nodes": nodes})
    assert done.returncode == 0, done.stdout[-3000:]
    assert calls == 0
