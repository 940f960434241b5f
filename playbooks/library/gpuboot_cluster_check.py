#!/usr/bin/python
"""The validation gate: asks the API server whether the cluster is what the inventory asked."""
from __future__ import annotations

DOCUMENTATION = r"""
module: gpuboot_cluster_check
short_description: Check a gpuboot cluster through its API server and report each shortfall
description:
  - Every GPU node advertises the allocatable resources the inventory implies (GPUs x
    time-slicing replicas, or the MIG devices of its layout) and carries GPU Feature Discovery's
    family, product and count labels of its declared model; the GPU Operator's ClusterPolicy
    is ready and every operand pod is ready, per node; a smoke Job per GPU node group requests
    one GPU (or MIG device) and runs nvidia-smi; every fabric node advertises the RDMA and VF
    resources its NICs imply, the NicClusterPolicy is ready and, with VFs, the SR-IOV config
    daemon reports them made; a pod on each secondary network's node gets an address on it;
    with Calico every TigeraStatus is Available; a pod on one node reaches a pod on another.
  - Returns one row per check (node, check, want, got, ok, reason). Jobs and pods it starts are
    deleted before it returns; the namespace it runs them in is kept (created once).
options:
  kubeconfig: {type: path, required: true}
  gpu_nodes:
    type: dict
    default: {}
    description: "node -> {resources: {name: count} or null, per_gpu: {name: count} each GPU yields when the count is not declared, found_gpus: the GPUs discovery found on the node, group: the node's GPU group, gfd_labels: {label: value} GPU Feature Discovery must have set}."
  gpu_namespace: {type: str, default: gpu-operator}
  fabric_nodes:
    type: dict
    default: {}
    description: "node -> {resource: count, or null when only a count above 0 is known} of its NICs (RDMA, VFs)."
  network_namespace: {type: str, default: nvidia-network-operator}
  sriov: {type: bool, default: false, description: NIC groups want VFs; their node states must report them made.}
  networks:
    type: list
    elements: dict
    default: []
    description: "Secondary networks: {name, namespace, node, resource (to request, or null)}; a pod attaches to each."
  smoke_image: {type: str, default: ""}
  probe_image: {type: str, default: ""}
  calico: {type: bool, default: false}
  namespace: {type: str, default: gpuboot-validate}
  timeout: {type: int, default: 180, description: Seconds each Job or probe may take.}
  settle: {type: int, default: 60, description: "Seconds the node checks (allocatable, GFD labels) read the nodes again before a shortfall counts: the kubelet publishes a device plugin's devices in its next node status."}
"""

import json
import re
import time
import uuid

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuboot_kube import Kube, KubeError, operand_of, pod_problem, pod_ready

RUN_LABEL = "gpuboot.io/validate"


def _dns(text):
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40].rstrip("-") or "group"


def row(node, check, want, got, ok, reason=""):
    return {"node": node, "check": check, "want": want, "got": got, "ok": bool(ok), "reason": reason}


def _fmt(resources):
    return ", ".join(f"{k}={v}" for k, v in sorted(resources.items())) or "none"


def _gpu_resource(name):
    return name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-")


def check_resources(nodes, gpu_nodes):
    rows = []
    for name, want in sorted(gpu_nodes.items()):
        node = nodes.get(name)
        if node is None:
            rows.append(row(name, "allocatable", _fmt(want.get("resources") or {}), "no such node", False,
                            "the node is not in the cluster"))
            continue
        # A resource at 0 is kubelet's memory of what a device plugin no longer serves (nvidia.com/gpu
        # once the MIG manager cut the node's GPUs into MIG devices): not advertised.
        got = {k: int(v) for k, v in node["status"].get("allocatable", {}).items()
               if _gpu_resource(k) and int(v) > 0}
        wanted = want.get("resources")
        found, per_gpu = want.get("found_gpus"), want.get("per_gpu")
        if wanted is None and found is not None and per_gpu:
            # The inventory leaves the count out: the GPUs preflight's discovery finds on the node.
            wanted = {resource: count * found for resource, count in per_gpu.items()}
            ok = got == wanted
            rows.append(row(name, "allocatable", f"{_fmt(wanted)} ({found} GPU(s) found on the node)", _fmt(got), ok,
                            "" if ok else "the device plugin advertises other resources than the GPUs the node "
                            "has imply (gpu.count is not declared: the count is what the node's PCI bus shows)"))
            continue
        if wanted is None:  # neither declared nor found (a MIG layout needs the count): any GPU at all
            rows.append(row(name, "allocatable", "nvidia.com/* > 0", _fmt(got), sum(got.values()) > 0,
                            "" if got else "the node advertises no GPU resource"))
            continue
        ok = got == wanted
        rows.append(row(name, "allocatable", _fmt(wanted), _fmt(got), ok,
                        "" if ok else "the device plugin advertises other resources than the inventory implies"))
    return rows


def check_gfd_labels(nodes, gpu_nodes):
    """GPU Feature Discovery's labels against the declared model and count: the device plugin's
    counts can match while the node holds other GPUs (an L40S node in an H100 group)."""
    rows = []
    for name, want in sorted(gpu_nodes.items()):
        node = nodes.get(name)
        if node is None:
            continue
        labels = node["metadata"].get("labels", {})
        for key, wanted in sorted((want.get("gfd_labels") or {}).items()):
            got = labels.get(key)
            reason = ""
            if got is None:
                reason = f"GPU Feature Discovery has not labelled the node with {key}"
            elif got != wanted:
                reason = (f"GPU Feature Discovery found {key}={got} on the node; check its GPUs (nvidia-smi -L) "
                          "or fix gpuboot_node.gpu.model/count in the inventory")
            rows.append(row(name, f"label {key.removeprefix('nvidia.com/')}", wanted, got or "missing", not reason, reason))
    return rows


def check_operator(kube, namespace, gpu_nodes):
    """The ClusterPolicy, every operand pod that is not Ready, and every GPU node that lacks a
    pod of an operand it must run (the driver, the toolkit, ...: gpu_nodes[node]["operands"])."""
    rows = []
    policy = kube.read("clusterpolicies.nvidia.com", "cluster-policy")
    state = (policy or {}).get("status", {}).get("state") if policy else None
    rows.append(row("-", "ClusterPolicy", "ready", state or "missing", state == "ready",
                    "" if state == "ready" else "the GPU Operator has not made every operand ready"))
    pods = (kube.read("pods", "-n", namespace) or {"items": []})["items"]
    present = {}
    for pod in pods:
        node = pod["spec"].get("nodeName", "(not scheduled)")
        app = operand_of(pod)
        present.setdefault(node, []).append(app)
        if gpu_nodes and node not in gpu_nodes and node != "(not scheduled)":
            continue
        ready = pod["status"].get("phase") == "Succeeded" or pod_ready(pod)
        if not ready:
            rows.append(row(node, f"operand {app}", "Ready", pod["status"].get("phase", "?"), False,
                            f"{pod['metadata']['name']}: {pod_problem(pod)}"))
    for node, want in sorted(gpu_nodes.items()):
        for operand in want.get("operands") or []:
            # A driver DaemonSet per kernel is named with a suffix, an NVIDIADriver's otherwise
            # (operand_of counts every one of them as the driver).
            if not any(app == operand or app.startswith(operand + "-") for app in present.get(node, [])):
                rows.append(row(node, f"operand {operand}", "a Ready pod", "no pod", False,
                                f"the GPU Operator runs no {operand} pod on the node; check its labels "
                                f"(kubectl get node {node} --show-labels) and the DaemonSet's node selector"))
    return rows


def check_fabric_resources(nodes, fabric_nodes):
    rows = []
    for name, wanted in sorted(fabric_nodes.items()):
        node = nodes.get(name)
        if node is None:
            rows.append(row(name, "fabric allocatable", _fmt({k: v or "?" for k, v in wanted.items()}), "no such node",
                            False, "the node is not in the cluster"))
            continue
        allocatable = node["status"].get("allocatable", {})
        got = {k: int(allocatable.get(k, 0)) for k in wanted}
        ok = all(got[k] == v if v is not None else got[k] > 0 for k, v in wanted.items())
        rows.append(row(name, "fabric allocatable", _fmt({k: v if v is not None else ">0" for k, v in wanted.items()}),
                        _fmt(got), ok, "" if ok else "RDMA/VF resources differ from the NICs the inventory declares "
                        "(a selector that matches no port advertises 0)"))
    return rows


def check_fabric(kube, fabric_nodes, namespace, sriov):
    """The NicClusterPolicy and, with VFs, each fabric node's SR-IOV sync status."""
    policy = kube.read("nicclusterpolicies.mellanox.com", "nic-cluster-policy")
    state = (policy or {}).get("status", {}).get("state") if policy else None
    rows = [row("-", "NicClusterPolicy", "ready", state or "missing", state == "ready",
                "" if state == "ready" else "the Network Operator has not made every component ready")]
    if not sriov:
        return rows
    found = kube.read("sriovnetworknodestates.sriovnetwork.openshift.io", "-n", namespace) or {"items": []}
    states = {s["metadata"]["name"]: s.get("status", {}) for s in found["items"]}
    for name in sorted(fabric_nodes):
        status = states.get(name, {})
        sync = status.get("syncStatus", "not reported")
        rows.append(row(name, "VFs made", "Succeeded", sync, sync == "Succeeded",
                        "" if sync == "Succeeded" else status.get("lastSyncError", "")))
    return rows


def read_nodes(kube):
    # A kubectl that cannot answer fails the check; it is never read as "no nodes".
    return {n["metadata"]["name"]: n for n in (kube.read("nodes") or {"items": []})["items"]}


def settled(kube, checks, settle, clock=time.monotonic, sleep=time.sleep):
    """The rows of the checks on the nodes' objects, read again every 5 s until all pass or
    `settle` s have gone: the kubelet publishes a device plugin's devices in its next node
    status (every 10 s by default) and GPU Feature Discovery labels on its own schedule, so a
    plugin that registered a moment before reads 0 at first. Returns the nodes last read too."""
    deadline = clock() + settle
    while True:
        nodes = read_nodes(kube)
        rows = [r for check in checks for r in check(nodes)]
        if all(r["ok"] for r in rows) or clock() >= deadline:
            return nodes, rows
        sleep(5)


def check_attach(kube, namespace, networks, image, timeout):
    """A pod on a node of each secondary network attaches to it: Multus reports an address."""
    rows = []
    for net in networks:
        run_id = f"attach-{_dns(net['name'])}-{uuid.uuid4().hex[:8]}"[:63]
        spec = _pod_spec(net["node"], image, ("args", ["pause"]), {net["resource"]: "1"} if net.get("resource") else None)
        kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "generateName": f"attach-{_dns(net['name'])}-", "namespace": namespace, "labels": {RUN_LABEL: run_id},
            "annotations": {"k8s.v1.cni.cncf.io/networks": f"{net['namespace']}/{net['name']}"}}, "spec": spec})
        deadline = time.monotonic() + timeout
        pod, addresses = None, []
        while time.monotonic() < deadline and not addresses:
            items = (kube.get("pods", "-n", namespace, "-l", f"{RUN_LABEL}={run_id}") or {"items": []})["items"]
            pod = items[0] if items else None
            status = (pod or {}).get("metadata", {}).get("annotations", {}).get("k8s.v1.cni.cncf.io/network-status")
            try:
                attached = [a for a in json.loads(status or "[]") if a.get("name") == f"{net['namespace']}/{net['name']}"]
            except ValueError:
                attached = []
            addresses = [ip for a in attached for ip in a.get("ips", [])]
            if not addresses:
                time.sleep(2)
        rows.append(row(net["node"], f"attach {net['namespace']}/{net['name']}", "an address", ", ".join(addresses) or "none",
                        bool(addresses), "" if addresses else (pod_problem(pod) if pod else "the pod was not created")))
    return rows


def check_calico(kube):
    found = (kube.read("tigerastatuses.operator.tigera.io") or {"items": []})["items"]
    if not found:
        return [row("-", "Calico", "every TigeraStatus Available", "none reported", False,
                    "the tigera-operator reports no component")]
    rows = []
    for item in found:
        conditions = {c["type"]: c for c in item.get("status", {}).get("conditions", [])}
        ok = conditions.get("Available", {}).get("status") == "True"
        why = conditions.get("Degraded") or conditions.get("Progressing") or {}
        rows.append(row("-", f"Calico {item['metadata']['name']}", "Available", "Available" if ok else "not Available",
                        ok, "" if ok else f"{why.get('reason', '')}: {why.get('message', '')}".strip(": ")))
    return rows


def wait_pod(kube, namespace, selector, timeout, done=("Succeeded", "Failed")):
    deadline = time.monotonic() + timeout
    pod = None
    while time.monotonic() < deadline:
        items = (kube.get("pods", "-n", namespace, "-l", selector) or {"items": []})["items"]
        pod = items[0] if items else None
        if pod and pod["status"].get("phase") in done:
            return pod
        time.sleep(2)
    return pod


def _pod_spec(node, image, command, resources):
    """`command` is ("command", [...]) to replace the image's entrypoint or ("args", [...]) to
    pass arguments to it (agnhost's image runs /agnhost)."""
    key, argv = command
    spec = {"restartPolicy": "Never", "tolerations": [{"operator": "Exists"}], "containers": [
        {"name": "check", "image": image, key: argv,
         "resources": {"limits": resources} if resources else {}}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return spec


def run_pod(kube, namespace, name, node, image, command, resources, timeout, done=("Succeeded", "Failed")):
    """A pod of this run only (its own label value), waited for until `done`."""
    run_id = f"{name}-{uuid.uuid4().hex[:8]}"[:63]
    kube.create({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"generateName": f"{name}-", "namespace": namespace, "labels": {RUN_LABEL: run_id}},
                 "spec": _pod_spec(node, image, command, resources)})
    return wait_pod(kube, namespace, f"{RUN_LABEL}={run_id}", timeout, done)


def run_job(kube, namespace, name, node, image, command, resources, timeout):
    """A Job of one pod and no retry, waited for until its pod ends."""
    run_id = f"{name}-{uuid.uuid4().hex[:8]}"[:63]
    kube.create({"apiVersion": "batch/v1", "kind": "Job",
                 "metadata": {"generateName": f"{name}-", "namespace": namespace, "labels": {RUN_LABEL: run_id}},
                 "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 600, "template": {
                     "metadata": {"labels": {RUN_LABEL: run_id}},
                     "spec": _pod_spec(node, image, command, resources)}}})
    return wait_pod(kube, namespace, f"{RUN_LABEL}={run_id}", timeout)


def cleanup(kube, namespace):
    for kind in ("jobs", "pods"):
        kube.run("delete", kind, "-n", namespace, "-l", RUN_LABEL, "--wait=false", "--ignore-not-found",
                 "--cascade=background")


def check_smoke(kube, namespace, gpu_nodes, image, timeout):
    rows = []
    groups = {}
    for name, want in sorted(gpu_nodes.items()):
        groups.setdefault(want.get("group") or name, name)
    for group, node in sorted(groups.items()):
        resources = gpu_nodes[node].get("resources") or {"nvidia.com/gpu": 1}
        resource = "nvidia.com/gpu" if "nvidia.com/gpu" in resources else sorted(resources)[0]
        pod = run_job(kube, namespace, "smoke-" + _dns(group), node, image, ("command", ["nvidia-smi", "-L"]), {resource: "1"},
                      timeout)
        phase = (pod or {}).get("status", {}).get("phase", "not created")
        ok = phase == "Succeeded"
        reason = ""
        if not ok:
            reason = pod_problem(pod) if pod else "the pod was not created"
        rows.append(row(node, f"smoke {resource}=1 nvidia-smi", "Succeeded", phase, ok, reason))
    return rows


def check_network(kube, namespace, nodes, image, timeout):
    ready = sorted(n for n, body in nodes.items()
                   if any(c["type"] == "Ready" and c["status"] == "True" for c in body["status"].get("conditions", [])))
    workers = [n for n in ready if "node-role.kubernetes.io/control-plane" not in nodes[n]["metadata"].get("labels", {})]
    pair = (workers + [n for n in ready if n not in workers])[:2]
    if len(pair) < 2:
        return [row("-", "pod network", "two Ready nodes", str(len(ready)), False, "pod-to-pod needs two Ready nodes")]
    server = run_pod(kube, namespace, "net-server", pair[0], image, ("args", ["netexec", "--http-port=8080"]), None,
                     timeout, done=("Running", "Failed", "Succeeded"))
    address = (server or {}).get("status", {}).get("podIP")
    if not server or server["status"].get("phase") != "Running" or not address:
        return [row(pair[0], "pod network", "server Running", (server or {}).get("status", {}).get("phase", "none"),
                    False, pod_problem(server) if server else "the server pod was not created")]
    client = run_pod(kube, namespace, "net-client", pair[1], image,
                     ("args", ["connect", f"{address}:8080", "--timeout=5s"]), None, timeout)
    phase = (client or {}).get("status", {}).get("phase", "none")
    return [row(f"{pair[1]} -> {pair[0]}", "pod network", "connected", phase, phase == "Succeeded",
                "" if phase == "Succeeded" else (pod_problem(client) if client else "no client pod"))]


def main():
    module = AnsibleModule(argument_spec={
        "kubeconfig": {"type": "path", "required": True},
        "gpu_nodes": {"type": "dict", "default": {}},
        "gpu_namespace": {"type": "str", "default": "gpu-operator"},
        "fabric_nodes": {"type": "dict", "default": {}},
        "network_namespace": {"type": "str", "default": "nvidia-network-operator"},
        "sriov": {"type": "bool", "default": False},
        "networks": {"type": "list", "elements": "dict", "default": []},
        "smoke_image": {"type": "str", "default": ""},
        "probe_image": {"type": "str", "default": ""},
        "calico": {"type": "bool", "default": False},
        "namespace": {"type": "str", "default": "gpuboot-validate"},
        "timeout": {"type": "int", "default": 180},
        "settle": {"type": "int", "default": 60},
    }, supports_check_mode=False)
    p = module.params
    kube = Kube(p["kubeconfig"])
    changed = False
    if kube.get("namespace", p["namespace"]) is None:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": p["namespace"], "labels": {
            "pod-security.kubernetes.io/enforce": "baseline"}}})
        changed = True
    rows = []
    checks = []
    if p["gpu_nodes"]:
        checks += [lambda nodes: check_resources(nodes, p["gpu_nodes"]), lambda nodes: check_gfd_labels(nodes, p["gpu_nodes"])]
    if p["fabric_nodes"]:
        checks.append(lambda nodes: check_fabric_resources(nodes, p["fabric_nodes"]))
    try:
        nodes, rows = settled(kube, checks, p["settle"])
        if p["gpu_nodes"]:
            rows += check_operator(kube, p["gpu_namespace"], p["gpu_nodes"])
            if p["smoke_image"]:
                rows += check_smoke(kube, p["namespace"], p["gpu_nodes"], p["smoke_image"], p["timeout"])
        if p["fabric_nodes"]:
            rows += check_fabric(kube, p["fabric_nodes"], p["network_namespace"], p["sriov"])
            if p["probe_image"]:
                rows += check_attach(kube, p["namespace"], p["networks"], p["probe_image"], p["timeout"])
        if p["calico"]:
            rows += check_calico(kube)
        if p["probe_image"]:
            rows += check_network(kube, p["namespace"], nodes, p["probe_image"], p["timeout"])
    except KubeError as exc:
        module.fail_json(msg=f"the API server did not answer the check: {exc}", rows=rows)
    finally:
        cleanup(kube, p["namespace"])
    failed = [r for r in rows if not r["ok"]]
    module.exit_json(changed=changed, rows=rows, short=len(failed))


if __name__ == "__main__":
    main()
