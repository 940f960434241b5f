"""Pods for a real operator on a real API server with no node: the DaemonSet, Deployment and
ReplicaSet controllers and the scheduler, all real, make and bind its operand pods, and KubeletDouble, a TEST DOUBLE of the
nodes' kubelets, reports them as a kubelet would. Used where an operator built from NVIDIA's
source must see its operands run (readiness, the driver upgrade) and no GPU or NIC exists."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpuboot_lab.kubernetes import KubernetesBuild, matrix_versions
from tests.support.apiserver import ETCD, ApiServer
from tests.support.mirror_fixture import free_port

BROKEN = "broken"  # an image whose tag holds this word is one whose container cannot start


def crashes_if_broken(pod: dict, container: dict) -> bool:  # noqa: ARG001 (a rule sees the pod too)
    return BROKEN in container["image"]


class Background:
    """Runs `_run` on a daemon thread between entering and leaving; `_stop` is set on leaving
    and `_halt` then ends what the thread waits on."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._halt()
        self._thread.join(30)

    def _run(self) -> None:
        raise NotImplementedError

    def _halt(self) -> None:
        """Nothing by default: a loop that waits on `_stop` ends by itself."""


class KubeletDouble(Background):
    """TEST DOUBLE of the nodes' kubelets, for the pods of one namespace. Each pod the scheduler
    bound is reported as its kubelet reports it once its containers run (Running, init
    containers completed, every container ready), and a deleted one is removed as a kubelet
    does once its containers stopped. A container the `crashing` rule picks is reported as one
    that cannot start: not ready, restarted eleven times (k8s-operator-libs takes more than ten
    for a failed driver) and waiting in CrashLoopBackOff. The rule can change while it runs.
    It writes pod status and finishes deletions only: every Node, label and DaemonSet change
    seen is the real controllers'."""

    def __init__(self, api: ApiServer, namespace: str,
                 crashing: Callable[[dict, dict], bool] = crashes_if_broken):
        super().__init__()
        self.api, self.namespace, self.crashing = api, namespace, crashing
        self.errors: list[str] = []
        self._reported: dict[str, str] = {}  # pod uid -> the status last written, as JSON

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            got = self.api.kubectl("get", "pods", "-n", self.namespace, "-o", "json", check=False)
            if got.returncode != 0:
                continue
            for pod in json.loads(got.stdout)["items"]:
                try:
                    self._act(pod)
                except subprocess.CalledProcessError as error:  # a pod deleted meanwhile is no error
                    if "NotFound" not in (error.stderr or ""):
                        self.errors.append(f"{pod['metadata']['name']}: {error.stderr}")

    def _act(self, pod: dict) -> None:
        meta = pod["metadata"]
        if not pod["spec"].get("nodeName"):
            return
        if meta.get("deletionTimestamp"):
            self.api.kubectl("delete", "pod", "-n", self.namespace, meta["name"], "--grace-period=0", "--force",
                             "--wait=false")
            return
        verdict = json.dumps([self.crashing(pod, c) for c in pod["spec"]["containers"]])
        if self._reported.get(meta["uid"]) == verdict:
            return
        self.api.kubectl("patch", "pod", "-n", self.namespace, meta["name"], "--subresource=status",
                         "--type=merge", "-p", json.dumps({"status": self.status(pod)}))
        self._reported[meta["uid"]] = verdict

    def status(self, pod: dict) -> dict:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        spec = pod["spec"]
        crashing = [self.crashing(pod, c) for c in spec["containers"]]

        def container(c: dict, crashes: bool) -> dict:
            if crashes:
                return {"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "started": False,
                        "restartCount": 11, "state": {"waiting": {
                            "reason": "CrashLoopBackOff",
                            "message": f"back-off restarting failed container {c['name']} (double: it cannot start)"}}}
            return {"name": c["name"], "image": c["image"], "imageID": "", "ready": True, "started": True,
                    "restartCount": 0, "state": {"running": {"startedAt": now}}}

        ready = "False" if any(crashing) else "True"
        return {
            "phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.0.0.1", "startTime": now,
            "conditions": [{"type": kind, "status": status, "lastTransitionTime": now}
                           for kind, status in (("PodScheduled", "True"), ("Initialized", "True"),
                                                ("ContainersReady", ready), ("Ready", ready))],
            "initContainerStatuses": [
                {"name": c["name"], "image": c["image"], "imageID": "", "ready": True, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}}
                for c in spec.get("initContainers", [])],
            "containerStatuses": [container(c, crashes) for c, crashes in zip(spec["containers"], crashing, strict=True)],
        }


@contextmanager
def api_with_pod_controllers(root: Path) -> Iterator[ApiServer]:
    """A real API server (the newest Kubernetes the matrix names) with the DaemonSet, Deployment
    and ReplicaSet controllers and the scheduler besides the controllers ApiServer runs."""
    if shutil.which(ETCD) is None or shutil.which("go") is None:
        pytest.fail("etcd and go are needed (bootstrap/setup.sh installs etcd-server; Go 1.24 or newer on PATH)")
    newest = sorted(matrix_versions(), key=lambda v: tuple(int(p) for p in v.lstrip("v").split(".")))[-1]
    built = KubernetesBuild(log=lambda m: None).build(newest)
    server = ApiServer(root, built.bin_dir).start()
    try:
        auth = [f"--kubeconfig={server.kubeconfig}", f"--authentication-kubeconfig={server.kubeconfig}",
                f"--authorization-kubeconfig={server.kubeconfig}", "--leader-elect=false",
                "--bind-address=127.0.0.1"]
        for name, extra in (("kube-controller-manager",
                             ["--controllers=daemonset-controller,deployment-controller,replicaset-controller"]),
                            ("kube-scheduler", [])):
            with open(root / f"{name}.log", "wb") as out:
                server.processes.append(subprocess.Popen(
                    [str(built.bin_dir / name), *auth, f"--secure-port={free_port()}", *extra],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        yield server
    finally:
        server.stop()


def untainted_node(api: ApiServer, name: str, labels: dict[str, str]) -> None:
    """A Node with the labels given (NFD's, GFD's). Admission taints a new Node not-ready, and
    the node lifecycle controller lifts the taint once its kubelet says Ready; that controller
    would also take these nodes for dead (no kubelet renews their lease), so its one effect
    wanted here is had by hand."""
    api.apply_node(name, labels)
    api.kubectl("taint", "nodes", name, "node.kubernetes.io/not-ready:NoSchedule-", check=False)


def ready_node(api: ApiServer, name: str, labels: dict[str, str]) -> None:
    """A Node as its kubelet registers it and reports it Ready, untainted (untainted_node)."""
    untainted_node(api, name, labels)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    api.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
        "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
        "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}))


def wait_until(what: str, check: Callable[[], bool], timeout: float, log: Path,
               found: Callable[[], object] | None = None) -> None:
    """Until check() holds; else fail naming `what`, what `found()` reads then (the policy's
    states, say) and the end of the operator's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(2)
    seen = f"; found {found()}" if found else ""
    pytest.fail(f"not within {timeout:.0f} s: {what}{seen}; the operator's log {log}:\n{log.read_text()[-3000:]}")


def policy_state(api: ApiServer, resource: str, name: str) -> str:
    """The state an operator writes into its policy's status (ready, notReady, ...)."""
    return api.kubectl("get", resource, name, "-o", "jsonpath={.status.state}", check=False).stdout.strip()


def pods_in(api: ApiServer, namespace: str, *selector: str) -> list[dict]:
    return json.loads(api.kubectl("get", "pods", "-n", namespace, *selector, "-o", "json").stdout)["items"]


def remove_workloads(api: ApiServer, namespace: str, log: Path) -> None:
    """The operator's workloads deleted and their pods gone, while the kubelets still answer:
    the next case deletes the namespace, which would wait forever on pods no kubelet ends."""
    for kind in ("daemonsets", "deployments"):
        api.kubectl("delete", kind, "-n", namespace, "--all", "--wait=false")
    wait_until("the operands' pods gone", lambda: not pods_in(api, namespace), 120, log)


def operator_says_not_ready(kubelets: KubeletDouble, crashing: Callable[[dict, dict], bool],
                            state: Callable[[], str], log: Path, timeout: float = 120) -> None:
    """Make the kubelets report the containers `crashing` picks as crashing, and wait for the
    operator to say so: its policy's state (`state()`) leaves ready for notReady."""
    kubelets.crashing = crashing
    wait_until("the operator's policy no longer ready", lambda: state() != "ready", timeout, log)
    assert state() == "notReady", f"the operator says {state()!r}; see {log}"
