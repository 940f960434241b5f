#!/usr/bin/python
"""Follows the GPU Operator's driver upgrade controller until every GPU node it manages runs
the target driver, or a node fails. It only reads: the operator cordons, drains and restarts."""
from __future__ import annotations

DOCUMENTATION = r"""
module: gpuboot_driver_upgrade
short_description: Wait for the GPU Operator's upgrade controller to move each node's driver
description:
  - Reads each node's label nvidia.com/gpu-driver-upgrade-state (upgrade-required, cordon-required,
    wait-for-jobs-required, pod-deletion-required, drain-required, pod-restart-required,
    validation-required, uncordon-required, upgrade-done, upgrade-failed) and the node's driver pod.
  - A node is done when its driver pod runs an image whose tag starts with the wanted version
    (C(<version>-<os tag>), precompiled C(<branch>-<kernel>-<os tag>)), is ready, and the node's
    state is upgrade-done (or unset). A node in upgrade-failed stops the wait at once, naming it.
  - A node labelled nvidia.com/gpu-driver-upgrade.skip=true is left to its old driver and reported.
  - Changes nothing.
options:
  kubeconfig: {type: path, required: true}
  namespace: {type: str, default: gpu-operator}
  nodes: {type: dict, required: true, description: "GPU node -> the tag prefix its driver image must have."}
  timeout: {type: int, default: 3600}
  poll: {type: int, default: 10}
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuboot_kube import Kube, is_driver_pod, pod_problem, pod_ready

STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
DONE, FAILED = "upgrade-done", "upgrade-failed"
def driver_tag(pod):
    image = next((c["image"] for c in pod["spec"]["containers"]), "")
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def node_status(node, pods, wanted):
    """(verdict, words) for one node: verdict is done, failed, skipped or waiting."""
    labels = node["metadata"].get("labels") or {}
    state = labels.get(STATE_LABEL, "")
    mine = [p for p in pods if p["spec"].get("nodeName") == node["metadata"]["name"] and is_driver_pod(p)
            and not p["metadata"].get("deletionTimestamp")]
    pod = mine[0] if mine else None
    tag = driver_tag(pod) if pod else ""
    if labels.get(SKIP_LABEL) == "true":
        return "skipped", f"skipped ({SKIP_LABEL}=true): keeps driver {tag or 'as it is'}"
    if state == FAILED:
        why = f"; driver pod {pod['metadata']['name']}: {pod_problem(pod)}" if pod else "; no driver pod"
        return "failed", f"{STATE_LABEL}={FAILED}{why}"
    if pod is None:
        return "waiting", f"state {state or '(none)'}, no driver pod yet"
    at_target = tag.startswith(f"{wanted}-")
    if at_target and pod_ready(pod) and state in ("", DONE):
        return "done", f"driver {tag} ready"
    ready = "ready" if pod_ready(pod) else f"not ready ({pod_problem(pod)})"
    return "waiting", f"state {state or '(none)'}, driver pod {pod['metadata']['name']} runs {tag or '?'}, {ready}"


def judge(nodes, pods, wanted):
    """Per wanted node, its verdict and words (a node missing from the cluster waits)."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    found = {}
    for name, version in wanted.items():
        node = by_name.get(name)
        found[name] = node_status(node, pods, version) if node else ("waiting", "not in the cluster")
    return found


def failure_message(found, waited, timeout, namespace, resume):
    failed = {n: w for n, (v, w) in found.items() if v == "failed"}
    if failed:
        lines = [f"the GPU Operator's driver upgrade failed on {', '.join(sorted(failed))}:"]
        lines += [f"- {n}: {w}" for n, w in sorted(failed.items())]
        lines.append(f"The operator leaves such a node cordoned. Read its driver pod's log (kubectl -n {namespace} logs "
                     f"POD --all-containers), fix the cause, label the node {STATE_LABEL}=upgrade-required to retry, "
                     f"then continue: {resume}")
        return "\n".join(lines)
    lines = [f"the GPU drivers are not all upgraded after {waited:.0f} s (timeout {timeout} s):"]
    lines += [f"- {n}: {w}" for n, (v, w) in sorted(found.items()) if v == "waiting"]
    lines.append(f"The operator goes on by itself (maxParallelUpgrades at a time); continue following it with: {resume}")
    return "\n".join(lines)


def main():
    module = AnsibleModule(argument_spec={
        "kubeconfig": {"type": "path", "required": True},
        "namespace": {"type": "str", "default": "gpu-operator"},
        "nodes": {"type": "dict", "required": True},
        "timeout": {"type": "int", "default": 3600},
        "poll": {"type": "int", "default": 10},
        "resume": {"type": "str", "default": "gpuboot upgrade INVENTORY --to RELEASE --resume"},
    }, supports_check_mode=True)
    p = module.params
    kube = Kube(p["kubeconfig"])
    started = time.monotonic()
    seen = {name: [] for name in p["nodes"]}
    while True:
        nodes = (kube.get("nodes") or {"items": []})["items"]
        pods = (kube.get("pods", "-n", p["namespace"]) or {"items": []})["items"]
        found = judge(nodes, pods, p["nodes"])
        for node in nodes:
            name = node["metadata"]["name"]
            state = (node["metadata"].get("labels") or {}).get(STATE_LABEL, "")
            if name in seen and state and (not seen[name] or seen[name][-1] != state):
                seen[name].append(state)
        waited = time.monotonic() - started
        verdicts = {v for v, _ in found.values()}
        report = {n: {"verdict": v, "said": w, "states": seen[n]} for n, (v, w) in found.items()}
        if "failed" in verdicts or (verdicts - {"done", "skipped"} and waited >= p["timeout"]):
            module.fail_json(msg=failure_message(found, waited, p["timeout"], p["namespace"], p["resume"]),
                             nodes=report, waited=round(waited))
        if verdicts <= {"done", "skipped"}:
            module.exit_json(changed=False, nodes=report, waited=round(waited),
                             # not `skipped`: Ansible would take the whole task for skipped
                             left_alone=sorted(n for n, (v, _) in found.items() if v == "skipped"))
        time.sleep(min(p["poll"], max(1, p["timeout"] - waited)))


if __name__ == "__main__":
    main()
