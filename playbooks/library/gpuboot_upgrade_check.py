#!/usr/bin/python
"""gpuboot upgrade's checks, through the API server: before anything changes, and after each node."""
from __future__ import annotations

DOCUMENTATION = r"""
module: gpuboot_upgrade_check
short_description: Check a cluster before an upgrade, or gate one upgraded node
description:
  - stage=before (nothing is changed when it fails) - every inventory node is in the cluster
    and Ready; every kubelet and API server runs the release the upgrade starts from (or, with
    resume, the target: an upgrade in progress is refused without it); etcd answers with one
    healthy member per control plane; no PodDisruptionBudget forbids the evictions a drain makes.
  - stage=etcd (after an etcd restore, retried until it passes or the timeout) - one healthy
    etcd member per control plane.
  - stage=node (the gate after a node's upgrade, retried until it passes or the timeout) - the
    API answers /readyz through the control-plane endpoint; the node is Ready at the target
    version; on a control plane its static pods run the target images and are ready; every etcd
    member is healthy; no pod on the node is crash-looping. It passes only once all of that has
    held for `settle` seconds: right after the uncordon the node's pods come back, and one that
    cannot run on the new version shows it only after a start or two.
options:
  kubeconfig: {type: path, required: true}
  stage: {type: str, required: true, choices: [before, node, etcd]}
  nodes: {type: list, elements: str, default: [], description: The inventory's cluster nodes.}
  control_planes: {type: list, elements: str, default: []}
  from_version: {type: str, default: ""}
  version: {type: str, default: ""}
  resume: {type: bool, default: false}
  node: {type: str, default: ""}
  timeout: {type: int, default: 300, description: Seconds the node gate may wait for the node to pass.}
  settle: {type: int, default: 15, description: Seconds the node gate must hold without a problem before it passes.}
  reach:
    type: int
    default: 60
    description: Seconds stage=before asks the API again before it reports the API unreachable (it may be restarting).
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuboot_kube import Kube, node_ready, pod_problem, pod_ready

STATIC_PODS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


def image_tag(pod):
    image = pod["spec"]["containers"][0]["image"]
    return image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""


def version_problems(nodes, api_pods, wanted_nodes, from_version, version, resume):
    """Every kubelet and API server at from_version, or at version when resuming."""
    problems, moved = [], []
    allowed = {from_version, version}
    by_name = {n["metadata"]["name"]: n for n in nodes}
    for name in wanted_nodes:
        node = by_name.get(name)
        if node is None:
            problems.append(f"{name} is in the inventory but not in the cluster: `gpuboot up` joins it first")
            continue
        if not node_ready(node):
            problems.append(f"{name} is not Ready: an upgrade starts from a healthy cluster")
        kubelet = node["status"]["nodeInfo"]["kubeletVersion"]
        if kubelet == version and from_version != version:
            moved.append(f"{name} kubelet")
        elif kubelet not in allowed:
            problems.append(f"{name} runs kubelet {kubelet}: every node must be at {from_version} before an "
                            f"upgrade to {version} (one minor at a time, and the inventory's release is {from_version})")
    for pod in api_pods:
        tag = image_tag(pod)
        where = pod["spec"].get("nodeName", pod["metadata"]["name"])
        if tag == version and from_version != version:
            moved.append(f"{where} kube-apiserver")
        elif tag not in allowed:
            problems.append(f"{where} runs kube-apiserver {tag or '(no tag)'}, neither {from_version} nor {version}")
    behind = [n for n in nodes if n["metadata"]["name"] in wanted_nodes
              and n["status"]["nodeInfo"]["kubeletVersion"] != version]
    if moved and not behind and not any(image_tag(p) != version for p in api_pods):
        # Resuming past the Kubernetes part (the GPU drivers were left to finish) is allowed.
        if not resume:
            problems.append(f"the cluster already runs {version}: set gpuboot.release in the inventory to the "
                            f"release it runs (or continue a stopped upgrade with --resume)")
    elif moved and not resume:
        problems.append(f"an upgrade to {version} is in progress ({', '.join(moved)} already there): "
                        "continue it with --resume")
    return problems


def etcd_problems(members, health, control_planes):
    problems = []
    names = sorted(m.get("name", "?") for m in members)
    if len(members) != len(control_planes):
        problems.append(f"etcd has {len(members)} members ({', '.join(names)}) for {len(control_planes)} control "
                        "planes: remove or re-add the stray member first")
    for entry in health:
        if not entry.get("health"):
            problems.append(f"etcd member {entry.get('endpoint', '?')} is unhealthy: {entry.get('error', 'no reason')}")
    return problems


def pdb_problems(pdbs):
    """A budget that allows no eviction now makes a drain wait until its timeout."""
    problems = []
    for pdb in pdbs:
        status = pdb.get("status", {})
        if status.get("expectedPods", 0) > 0 and status.get("disruptionsAllowed", 0) == 0:
            meta = pdb["metadata"]
            problems.append(f"PodDisruptionBudget {meta['namespace']}/{meta['name']} allows no disruption now "
                            f"({status.get('currentHealthy', 0)} healthy, {status.get('desiredHealthy', 0)} required): "
                            "a drain would wait on it; add replicas or relax the budget")
    return problems


def node_gate_problems(node, pods, version, control_plane):
    """What keeps an upgraded node from passing its gate (empty: it passes)."""
    name = node["metadata"]["name"]
    problems = []
    if not node_ready(node):
        problems.append(f"{name} is not Ready")
    kubelet = node["status"]["nodeInfo"]["kubeletVersion"]
    if kubelet != version:
        problems.append(f"{name} runs kubelet {kubelet}, not {version}")
    if node.get("spec", {}).get("unschedulable"):
        problems.append(f"{name} is still cordoned")
    mine = [p for p in pods if p["spec"].get("nodeName") == name]
    if control_plane:
        for component in (*STATIC_PODS, "etcd"):
            pod = next((p for p in mine if p["metadata"]["name"] == f"{component}-{name}"), None)
            if pod is None:
                problems.append(f"{component}-{name} is not running")
                continue
            if component in STATIC_PODS and image_tag(pod) != version:
                problems.append(f"{component}-{name} runs {image_tag(pod)}, not {version}")
            if not pod_ready(pod):
                problems.append(f"{component}-{name} is not ready: {pod_problem(pod)}")
    for pod in mine:
        problems += pod_gate_problems(pod)
    return problems


# A container that cannot start or keeps stopping, in the kubelet's words.
FAILING = ("CrashLoopBackOff", "RunContainerError", "CreateContainerError", "CreateContainerConfigError",
           "ErrImagePull", "ImagePullBackOff", "InvalidImageName")
STARTING = ("ContainerCreating", "PodInitializing")


def pod_gate_problems(pod):
    """A pod of the node keeps the gate shut while it is still starting (after the uncordon the
    node's pods come back, and one that cannot run on the new version shows it only once it has
    started), or while a container of it fails."""
    if pod["status"].get("phase") not in ("Pending", "Running"):
        return []
    where = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    statuses = pod["status"].get("containerStatuses") or []
    if not statuses:
        return [f"{where} is still starting"]
    problems = []
    for status in statuses:
        if status.get("ready"):
            continue
        state, last = status.get("state") or {}, (status.get("lastState") or {}).get("terminated") or {}
        waiting = (state.get("waiting") or {}).get("reason")
        stopped = state.get("terminated") or {}
        if waiting in FAILING or stopped.get("exitCode", 0) != 0 or (waiting and last.get("exitCode", 0) != 0):
            problems.append(f"{where} is crash-looping ({status['name']}, {status.get('restartCount', 0)} restarts"
                            f"{', ' + waiting if waiting else ''})")
        elif waiting in STARTING:
            problems.append(f"{where} is still starting ({status['name']}: {waiting})")
    return problems


def _etcd(kube, control_planes):
    rc, out, err = kube.etcdctl(control_planes, "member", "list", "-w", "json")
    if rc != 0:
        return None, None, f"etcd does not answer: {err}"
    members = json.loads(out).get("members", [])
    rc, out, err = kube.etcdctl(control_planes, "endpoint", "health", "--cluster", "-w", "json")
    try:
        health = json.loads(out) if out.strip() else []
    except ValueError:
        health = []
    if rc != 0 and not health:
        return members, None, f"etcd health unknown: {err}"
    return members, health, ""


def reach(kube, patience, pause=3.0):
    """The cluster's nodes through the control-plane endpoint, asked again for up to `patience`
    seconds: an API server restarting or the endpoint moving its backend (right after control
    planes were upgraded, or on a loaded machine) is not an API that cannot be reached. Returns
    (nodes, None), or (None, kubectl's last words)."""
    started = time.monotonic()
    while True:
        rc, out, err = kube.run("get", "nodes", "-o", "json")
        if rc == 0:
            return json.loads(out)["items"], None
        if time.monotonic() - started + pause > patience:
            return None, (err or out).strip()[-300:] or f"kubectl exit {rc}"
        time.sleep(pause)


def before(kube, p):
    nodes, said = reach(kube, p["reach"])
    if nodes is None:
        return [f"the API server does not answer through the control-plane endpoint (asked for {p['reach']} s): {said}"]
    pods = (kube.get("pods", "-n", "kube-system", "-l", "component=kube-apiserver") or {"items": []})["items"]
    problems = version_problems(nodes, pods, p["nodes"], p["from_version"], p["version"], p["resume"])
    members, health, said = _etcd(kube, p["control_planes"])
    problems += [said] if said else etcd_problems(members, health, p["control_planes"])
    problems += pdb_problems((kube.get("pdb", "-A") or {"items": []})["items"])
    return problems


def gate(kube, p):
    rc, out, err = kube.run("get", "--raw", "/readyz")
    if rc != 0:
        return [f"the API does not answer /readyz through the control-plane endpoint: {(err or out).strip()}"]
    node = kube.get("node", p["node"])
    if node is None:
        return [f"{p['node']} is not in the cluster"]
    pods = (kube.get("pods", "-A", "--field-selector", f"spec.nodeName={p['node']}") or {"items": []})["items"]
    problems = node_gate_problems(node, pods, p["version"], p["node"] in p["control_planes"])
    members, health, said = _etcd(kube, p["control_planes"])
    problems += [said] if said else etcd_problems(members, health, p["control_planes"])
    return problems


def etcd_only(kube, p):
    members, health, said = _etcd(kube, p["control_planes"])
    return [said] if said else etcd_problems(members, health, p["control_planes"])


def main():
    module = AnsibleModule(argument_spec={
        "kubeconfig": {"type": "path", "required": True},
        "stage": {"type": "str", "required": True, "choices": ["before", "node", "etcd"]},
        "nodes": {"type": "list", "elements": "str", "default": []},
        "control_planes": {"type": "list", "elements": "str", "default": []},
        "from_version": {"type": "str", "default": ""},
        "version": {"type": "str", "default": ""},
        "resume": {"type": "bool", "default": False},
        "node": {"type": "str", "default": ""},
        "timeout": {"type": "int", "default": 300},
        "settle": {"type": "int", "default": 15},
        "reach": {"type": "int", "default": 60},
    }, supports_check_mode=True)
    p = module.params
    kube = Kube(p["kubeconfig"])
    if p["stage"] == "before":
        problems = before(kube, p)
        waited = 0.0
    else:
        started = time.monotonic()
        settle = p["settle"] if p["stage"] == "node" else 0
        healthy_since = None
        while True:
            problems = gate(kube, p) if p["stage"] == "node" else etcd_only(kube, p)
            now = time.monotonic()
            healthy_since = None if problems else (healthy_since or now)
            if (healthy_since is not None and now - healthy_since >= settle) or now - started > p["timeout"]:
                break
            time.sleep(3)
        waited = round(time.monotonic() - started, 1)
    if problems:
        module.fail_json(msg="; ".join(problems), problems=problems, waited=waited)
    module.exit_json(changed=False, problems=[], waited=waited)


if __name__ == "__main__":
    main()
