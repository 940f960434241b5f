"""What gpuboot's cluster modules share: kubectl through one kubeconfig, the words a pod or node
gives for not being ready, and which GPU Operator operand a pod is. Read by
gpuboot_cluster_check, gpuboot_upgrade_check and gpuboot_driver_upgrade."""
from __future__ import annotations

import json
import subprocess

# kubeadm's etcd client certificate on a control plane, as its etcd pod mounts it.
ETCD_CERTS = ("--cacert=/etc/kubernetes/pki/etcd/ca.crt", "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
              "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key")


# The GPU Operator's driver pods: its ClusterPolicy's DaemonSets (app nvidia-driver-daemonset,
# with a suffix per kernel when precompiled) and an NVIDIADriver object's (app
# nvidia-<driverType>-driver-<os>-<hash>, both with app.kubernetes.io/component nvidia-driver).
DRIVER_OPERAND = "nvidia-driver-daemonset"
DRIVER_APPS = (DRIVER_OPERAND, "nvidia-gpu-driver")


def is_driver_pod(pod):
    labels = pod["metadata"].get("labels") or {}
    return labels.get("app.kubernetes.io/component") == "nvidia-driver" or \
        str(labels.get("app", "")).startswith(DRIVER_APPS)


def operand_of(pod):
    """The operand a GPU Operator pod runs, by the app label the operator gives its DaemonSet
    (every driver pod counts as nvidia-driver-daemonset, whichever object made it)."""
    if is_driver_pod(pod):
        return DRIVER_OPERAND
    return (pod["metadata"].get("labels") or {}).get("app", pod["metadata"]["name"])


class KubeError(RuntimeError):
    """kubectl could not answer: not the same as an answer that is empty."""


class Kube:
    def __init__(self, kubeconfig):
        self.kubeconfig = kubeconfig

    def run(self, *args, stdin=None, timeout=60):
        try:
            proc = subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, "--request-timeout=20s", *args],
                                  input=stdin, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, "", f"kubectl {' '.join(args[:3])} took more than {timeout} s"
        return proc.returncode, proc.stdout, proc.stderr

    def get(self, *args):
        """The object or list; None when it does not exist (NotFound), and also when kubectl
        fails otherwise. A caller whose answer must not read a failure as "none" uses read()."""
        rc, out, _ = self.run("get", *args, "-o", "json")
        return json.loads(out) if rc == 0 else None

    def read(self, *args):
        """The object or list, None when it does not exist; raises KubeError when kubectl
        fails otherwise (the API unreachable, a timeout, no rights), so that a failure is never
        mistaken for an empty answer."""
        rc, out, err = self.run("get", *args, "-o", "json")
        if rc == 0:
            return json.loads(out)
        if "NotFound" in err or "not found" in err:
            return None
        raise KubeError(f"kubectl get {' '.join(args)} failed: {(err or out).strip()[-300:] or f'exit {rc}'}")

    def create(self, obj):
        rc, out, err = self.run("create", "-f", "-", "-o", "json", stdin=json.dumps(obj))
        if rc != 0:
            raise RuntimeError(err.strip())
        return json.loads(out)

    def etcdctl(self, control_planes, *args):
        """etcdctl inside the first etcd pod that answers (the one on a node being upgraded may
        be restarting); returns (rc, stdout, what went wrong)."""
        said = []
        for node in control_planes:
            rc, out, err = self.run("-n", "kube-system", "exec", f"etcd-{node}", "--", "etcdctl",
                                    "--endpoints=https://127.0.0.1:2379", *ETCD_CERTS, *args)
            if rc == 0:
                return rc, out, ""
            said.append(f"etcd-{node}: {(err or out).strip().splitlines()[-1:] or ['no answer']}")
        return 1, "", "; ".join(said)


def pod_problem(pod):
    """Why a pod is not ready, in the words of its containers or the scheduler."""
    statuses = pod["status"].get("containerStatuses", []) + pod["status"].get("initContainerStatuses", [])
    for status in statuses:
        state = status.get("state", {})
        for key in ("waiting", "terminated"):
            if key in state and state[key].get("reason") not in (None, "Completed"):
                return f"{state[key].get('reason')}: {state[key].get('message', '').strip()}".strip(": ")
    for condition in pod["status"].get("conditions", []):
        if condition.get("status") == "False" and condition.get("message"):
            return f"{condition.get('reason', '')}: {condition['message']}".strip(": ")
    return pod["status"].get("phase", "Unknown")


def pod_ready(pod):
    statuses = pod["status"].get("containerStatuses", [])
    return bool(statuses) and all(s.get("ready") for s in statuses)


def node_ready(node):
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
