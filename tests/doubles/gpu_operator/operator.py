"""TEST DOUBLE of the NVIDIA GPU Operator's controller, run against a real lab cluster.

The real operator (and a GPU) cannot exist here. This double does, through the lab's real API
server, what gpuboot depends on, from the ClusterPolicy the (double) chart made and the
node's double hardware facts:
- one DaemonSet per operand the ClusterPolicy turns on, with the image the ClusterPolicy
  names (so the lab's nodes really pull every operand through the mirror: an image the mirror
  plan missed stays in ImagePullBackOff), on the GPU nodes the real operator would pick;
- GPU labels (nvidia.com/gpu.present, .product, .count, nvidia.com/mig.config.state) as GFD
  and the MIG manager set them;
- allocatable resources as the device plugin would advertise them: GPUs x the time-slicing
  replicas of the profile the node's nvidia.com/device-plugin.config label picks, or the MIG
  devices of the layout its nvidia.com/mig.config label names (filtered by the GPU's PCI id,
  named by the ClusterPolicy's MIG strategy);
- ClusterPolicy status.state ready when every operand DaemonSet is ready on every node, with
  the Ready condition's reason Reconciled; ready with NoGPUNodes when none of its GPU nodes
  is in the cluster, as NVIDIA's operator says it.

Operand pods run a double image (busybox): a node-local fault file
/etc/gpuboot-double/fault-<operand> makes that operand's pod on that node exit with the
file's text, as a broken operand would.

With cdi.nriPluginEnabled, the toolkit's pod mounts the node's NRI directory, as the real
operator's does, and fails unless containerd's NRI socket is there: the toolkit then injects
GPUs through NRI and nothing else would work. It writes nothing into containerd's
configuration in that mode, as the real one does not."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.doubles.controller import DoubleController

FAULT_DIR = "/etc/gpuboot-double"
# Where containerd 2 listens for NRI plugins (its default socket_path).
NRI_DIR = "/var/run/nri"
NRI_SOCKET = f"{NRI_DIR}/nri.sock"
# ClusterPolicy section -> the DaemonSet the real operator names for it.
OPERANDS = {
    "driver": "nvidia-driver-daemonset",
    "toolkit": "nvidia-container-toolkit-daemonset",
    "devicePlugin": "nvidia-device-plugin-daemonset",
    "gfd": "gpu-feature-discovery",
    "dcgmExporter": "nvidia-dcgm-exporter",
    "migManager": "nvidia-mig-manager",
    "validator": "nvidia-operator-validator",
}


@dataclass(frozen=True)
class Hardware:
    """What a GPU node would report through NVML and NFD."""

    product: str       # GFD's nvidia.com/gpu.product, e.g. NVIDIA-H100-80GB-HBM3
    pci_device: str    # e.g. 0x2330
    count: int
    family: str = "hopper"  # GFD's nvidia.com/gpu.family (hopper, ada-lovelace, ...)
    os_tag: str = "ubuntu22.04"
    kernel: str = "5.15.0-1048-nvidia"


class DoubleGpuOperator(DoubleController):
    name = "gpu-operator-double"

    def __init__(self, kubectl: Path, kubeconfig: Path, hardware: dict[str, Hardware],
                 namespace: str = "gpu-operator") -> None:
        super().__init__(kubectl, kubeconfig)
        self.hardware, self.namespace = hardware, namespace

    # -- what the operator computes ----------------------------------------------
    def _config_map(self, name: str | None) -> dict:
        found = self._get("configmap", "-n", self.namespace, name) if name else None
        return (found or {}).get("data") or {}

    def resources(self, policy: dict, labels: dict, hw: Hardware) -> dict[str, int]:
        spec = policy["spec"]
        layout_name = labels.get("nvidia.com/mig.config")
        mig_configs = {}
        if layout_name:
            text = self._config_map(((spec.get("migManager") or {}).get("config") or {}).get("name")).get("config.yaml")
            mig_configs = (yaml.safe_load(text) or {}).get("mig-configs", {}) if text else {}
        found: dict[str, int] = {}
        whole = 0
        # mig-parted names a device by its PCI device id and vendor: 0x2330 + 10DE.
        device = f"{hw.pci_device}10de".lower()
        entries = [e for e in mig_configs.get(layout_name, [])
                   if not e.get("device-filter") or device in [f.lower() for f in e["device-filter"]]]
        claimed: set[int] = set()
        for entry in entries:
            indexes = range(hw.count) if entry["devices"] == "all" else [i for i in entry["devices"] if i < hw.count]
            for index in indexes:
                claimed.add(index)
                if not entry.get("mig-enabled"):
                    whole += 1
                    continue
                for profile, count in (entry.get("mig-devices") or {}).items():
                    name = "nvidia.com/gpu" if spec["mig"]["strategy"] == "single" else f"nvidia.com/mig-{profile}"
                    found[name] = found.get(name, 0) + count
        whole += hw.count - len(claimed)
        if whole:
            plugin = spec.get("devicePlugin") or {}
            config = plugin.get("config") or {}
            profile = labels.get("nvidia.com/device-plugin.config") or config.get("default")
            body = yaml.safe_load(self._config_map(config.get("name")).get(profile, "") or "{}") or {}
            shared = ((body.get("sharing") or {}).get("timeSlicing") or {}).get("resources") or []
            replicas = next((r["replicas"] for r in shared if r["name"] == "nvidia.com/gpu"), 1)
            found["nvidia.com/gpu"] = found.get("nvidia.com/gpu", 0) + whole * replicas
        return found

    def _daemonset(self, section: str, spec: dict, image: str) -> dict:
        name = OPERANDS[section]
        operand = name.removeprefix("nvidia-").removesuffix("-daemonset")
        expressions = [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]
        if section == "driver":
            expressions.append({"key": "nvidia.com/gpu.deploy.driver", "operator": "NotIn", "values": ["false"]})
        if section == "migManager":
            expressions.append({"key": "nvidia.com/mig.config", "operator": "Exists"})
        nri = section == "toolkit" and bool((spec.get("cdi") or {}).get("nriPluginEnabled"))
        script = (f"f={FAULT_DIR}/fault-{operand}; if [ -e $f ]; then cat $f >&2; exit 1; fi; "
                  + (f"if [ ! -S {NRI_SOCKET} ]; then echo 'containerd has no NRI socket at {NRI_SOCKET}: "
                     "cdi.nriPluginEnabled needs NRI on' >&2; exit 1; fi; " if nri else "")
                  + "exec /bin/busybox sleep 2147483647")
        mounts = [{"name": "faults", "mountPath": FAULT_DIR, "readOnly": True}]
        volumes = [{"name": "faults", "hostPath": {"path": FAULT_DIR, "type": "DirectoryOrCreate"}}]
        if nri:
            mounts.append({"name": "nri", "mountPath": NRI_DIR})
            volumes.append({"name": "nri", "hostPath": {"path": NRI_DIR, "type": "DirectoryOrCreate"}})
        return {
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": self.namespace, "labels": {"app": name}},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": expressions}]}}},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": operand, "image": image, "command": ["/bin/sh", "-c", script],
                                    "terminationMessagePolicy": "FallbackToLogsOnError",
                                    # Between crash-loop restarts a faulted container runs for an
                                    # instant; without a probe it counts Ready then and the policy
                                    # flips to ready (as a real operand's probe keeps it from doing).
                                    "readinessProbe": {"exec": {"command": [
                                        "/bin/sh", "-c", f"test ! -e {FAULT_DIR}/fault-{operand}"]},
                                        "periodSeconds": 2},
                                    "volumeMounts": mounts}],
                    "volumes": volumes}}}}

    def _image(self, section: str, spec: dict, node: Hardware | None = None) -> str:
        body = spec[section]
        tag = body["version"]
        if section == "driver":  # the operator appends the node's OS (precompiled: kernel and OS)
            tag = f"{tag}-{node.kernel}-{node.os_tag}" if body.get("usePrecompiled") else f"{tag}-{node.os_tag}"
        return f"{body['repository']}/{body['image']}:{tag}"

    def reconcile(self) -> str | None:
        """One pass; returns the state it reported (None without a ClusterPolicy)."""
        policy = self._get("clusterpolicies.nvidia.com", "cluster-policy")
        if policy is None:
            return None
        spec = policy["spec"]
        nodes = {n["metadata"]["name"]: n for n in (self._get("nodes") or {"items": []})["items"]}
        for name, hw in self.hardware.items():
            node = nodes.get(name)
            if node is None:
                continue
            labels = node["metadata"].get("labels") or {}
            resources = self.resources(policy, labels, hw)
            shared = resources.get("nvidia.com/gpu", 0) > hw.count
            gfd = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(hw.count),
                   "nvidia.com/gpu.product": hw.product + ("-SHARED" if shared else ""), "nvidia.com/gpu.family": hw.family}
            if "nvidia.com/mig.config" in labels:
                gfd["nvidia.com/mig.config.state"] = "success"
            self._apply([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": gfd}}])
            current = {k: v for k, v in (node.get("status", {}).get("capacity") or {}).items()
                       if k.startswith("nvidia.com/")}
            wanted = {k: str(v) for k, v in resources.items()}
            if current != wanted:
                patch = {k: None for k in current if k not in wanted} | wanted
                self._run("patch", "node", name, "--subresource=status", "--type=merge",
                          "-p", json.dumps({"status": {"capacity": patch, "allocatable": patch}}))
        sections = [s for s in OPERANDS if s in spec and (spec[s].get("enabled", True) or s == "validator")]
        drivers = {self._image("driver", spec, hw) for hw in self.hardware.values()} if "driver" in sections else set()
        objects = [self._daemonset(s, spec, self._image(s, spec)) for s in sections if s != "driver"]
        if drivers:  # one DaemonSet per driver image, as the operator makes one per kernel/OS
            for index, image in enumerate(sorted(drivers)):
                ds = self._daemonset("driver", spec, image)
                ds["metadata"]["name"] += f"-{index}" if len(drivers) > 1 else ""
                objects.append(ds)
        self._apply(objects)
        ready = True
        for ds in (self._get("daemonsets", "-n", self.namespace) or {"items": []})["items"]:
            status = ds.get("status") or {}
            if ds["metadata"]["name"].startswith(tuple(OPERANDS.values())):
                desired = status.get("desiredNumberScheduled", 0)
                ready &= desired > 0 and status.get("numberReady", 0) == desired
        # As NVIDIA's operator says it (v25.3, v26.7): `ready` also when it has no GPU node to
        # deploy to, told apart by the Ready condition's reason; Reconciled once operands run.
        gpu_nodes = [name for name in self.hardware if name in nodes]
        state = "ready" if ready or not gpu_nodes else "notReady"
        reason = ("Reconciled" if gpu_nodes else "NoGPUNodes") if state == "ready" else "OperandNotReady"
        condition = {"type": "Ready", "status": "True" if state == "ready" else "False", "reason": reason,
                     "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        status = policy.get("status") or {}
        said = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
        if status.get("state") != state or not said or said[0].get("reason") != reason:
            self._run("patch", "clusterpolicies.nvidia.com", "cluster-policy", "--subresource=status", "--type=merge",
                      "-p", json.dumps({"status": {"state": state, "namespace": self.namespace,
                                                   "conditions": [condition]}}))
        return state
