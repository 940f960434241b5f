"""TEST DOUBLE of the GPU Operator's driver upgrade controller (k8s-operator-libs' upgrade
state machine as the operator runs it when the ClusterPolicy's driver.upgradePolicy has
autoUpgrade), run against a real API server that has no kubelets.

It stands in for three things that cannot run here: the operator's upgrade controller, the
driver DaemonSet (OnDelete: a pod moves to the new image only when it is deleted) and the
node's kubelet (it writes the driver pod's status). Per reconcile, each GPU node whose driver
pod does not run the ClusterPolicy's driver image walks one step of the documented states in
its label nvidia.com/gpu-driver-upgrade-state:

  upgrade-required -> cordon-required (cordons) -> wait-for-jobs-required ->
  pod-deletion-required -> drain-required (only with upgradePolicy.drain.enable) ->
  pod-restart-required (deletes the driver pod; a new one at the new image) ->
  validation-required (the new pod ready) -> uncordon-required (uncordons) -> upgrade-done

with at most upgradePolicy.maxParallelUpgrades nodes past upgrade-required at once, nodes
labelled nvidia.com/gpu-driver-upgrade.skip=true left alone, and nodes labelled
nvidia.com/gpu.deploy.driver=false (preinstalled drivers) given no driver pod. A node named
in `broken` gets a new driver pod that never becomes ready (the container waits in
CrashLoopBackOff, as a driver whose modules do not load): after a few passes in
validation-required it is marked upgrade-failed and stays cordoned, as the operator leaves it.
The ClusterPolicy is checked as strictly as the real operator reads it: driver.repository,
image and version must be there, and upgradePolicy.maxParallelUpgrades must be a whole
number of 0 or more (0: no limit)."""
from __future__ import annotations

import json
from pathlib import Path

from tests.doubles.controller import DoubleController

STATE = "nvidia.com/gpu-driver-upgrade-state"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
STEPS = ("upgrade-required", "cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
         "pod-restart-required", "validation-required", "uncordon-required", "upgrade-done")
VALIDATION_PASSES_BEFORE_FAILING = 3


class DoubleDriverUpgrade(DoubleController):
    name = "gpu-operator-upgrade-double"

    def __init__(self, kubectl: Path, kubeconfig: Path, os_tags: dict[str, str], namespace: str = "gpu-operator",
                 broken: set[str] | None = None) -> None:
        super().__init__(kubectl, kubeconfig)
        self.os_tags, self.namespace = os_tags, namespace
        self.broken = set(broken or ())
        self.history: dict[str, list[str]] = {n: [] for n in os_tags}
        self.most_in_flight = 0
        self._validation: dict[str, int] = {}
        self._first_image: dict[str, str] = {}  # the driver each node started with

    def _policy_driver(self) -> tuple[dict, dict] | None:
        policy = self._get("clusterpolicies.nvidia.com", "cluster-policy")
        if policy is None:
            return None
        driver = policy["spec"].get("driver") or {}
        missing = [k for k in ("repository", "image", "version") if not driver.get(k)]
        if missing:
            raise ValueError(f"ClusterPolicy driver lacks {missing}")
        upgrade = driver.get("upgradePolicy") or {}
        parallel = upgrade.get("maxParallelUpgrades", 1)
        if not isinstance(parallel, int) or parallel < 0:
            raise ValueError(f"upgradePolicy.maxParallelUpgrades {parallel!r} is not a whole number >= 0")
        return driver, upgrade

    def _pod(self, node: str, image: str) -> None:
        name = f"nvidia-driver-daemonset-{node}"
        self._apply([{"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": name, "namespace": self.namespace,
                                   "labels": {"app": "nvidia-driver-daemonset",
                                              "app.kubernetes.io/component": "nvidia-driver"}},
                      "spec": {"nodeName": node, "containers": [{"name": "nvidia-driver-ctr", "image": image}]}}])
        broken = node in self.broken and image != self._first_image.get(node)
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False" if broken else "True"}],
                  "containerStatuses": [{
                      "name": "nvidia-driver-ctr", "image": image, "imageID": "", "ready": not broken,
                      "restartCount": 3 if broken else 0,
                      "state": {"waiting": {"reason": "CrashLoopBackOff",
                                            "message": "double: nvidia.ko failed to load (Unknown symbol)"}}
                      if broken else {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
        self._run("patch", "pod", "-n", self.namespace, name, "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": status}))

    def _label(self, node: str, state: str) -> None:
        self._run("label", "node", node, "--overwrite", f"{STATE}={state}")
        self.history[node].append(state)

    def reconcile(self) -> str | None:
        found = self._policy_driver()
        if found is None:
            return None
        driver, upgrade = found
        nodes = {n["metadata"]["name"]: n for n in (self._get("nodes") or {"items": []})["items"]}
        pods = {p["spec"].get("nodeName"): p for p in (self._get("pods", "-n", self.namespace) or {"items": []})["items"]
                if (p["metadata"].get("labels") or {}).get("app") == "nvidia-driver-daemonset"}
        in_flight = [n for n, node in nodes.items() if (node["metadata"].get("labels") or {}).get(STATE)
                     not in (None, "", "upgrade-required", "upgrade-done", "upgrade-failed")]
        limit = upgrade.get("maxParallelUpgrades", 1) or len(nodes)
        for name, os_tag in self.os_tags.items():
            node = nodes.get(name)
            labels = (node or {}).get("metadata", {}).get("labels") or {}
            if node is None or labels.get("nvidia.com/gpu.deploy.driver") == "false":
                continue
            wanted = f"{driver['repository']}/{driver['image']}:{driver['version']}-{os_tag}"
            pod = pods.get(name)
            if pod is None:  # the DaemonSet's first pod on the node: no upgrade, just the driver
                self._first_image[name] = wanted
                self._pod(name, wanted)
                self._label(name, "upgrade-done")
                continue
            state = labels.get(STATE, "")
            running = pod["spec"]["containers"][0]["image"]
            if labels.get(SKIP) == "true" or state == "upgrade-failed":
                continue
            if state in ("", "upgrade-done"):
                if running != wanted and autoupgrade(upgrade):
                    self._label(name, "upgrade-required")
                continue
            if state == "upgrade-required":
                if len(in_flight) >= limit:
                    continue
                in_flight.append(name)
            self._step(name, state, wanted, upgrade, pod)
        self.most_in_flight = max(self.most_in_flight, len(in_flight))
        return None

    def _step(self, name: str, state: str, wanted: str, upgrade: dict, pod: dict) -> None:
        following = STEPS[STEPS.index(state) + 1]
        if following == "drain-required" and not (upgrade.get("drain") or {}).get("enable"):
            following = "pod-restart-required"
        if state == "cordon-required":
            self._run("cordon", name)
        elif state == "pod-restart-required":
            # No kubelet here to confirm the end of the pod: the double ends it as the kubelet would.
            self._run("delete", "pod", "-n", self.namespace, pod["metadata"]["name"], "--grace-period=0", "--force")
            self._pod(name, wanted)
        elif state == "validation-required":
            ready = all(s.get("ready") for s in pod["status"].get("containerStatuses", []))
            if not ready:
                self._validation[name] = self._validation.get(name, 0) + 1
                if self._validation[name] >= VALIDATION_PASSES_BEFORE_FAILING:
                    self._label(name, "upgrade-failed")
                return
        elif state == "uncordon-required":
            self._run("uncordon", name)
        self._label(name, following)


def autoupgrade(upgrade: dict) -> bool:
    return bool(upgrade.get("autoUpgrade"))
