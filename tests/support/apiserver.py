"""A real API server for API-level tests: etcd and the kube-apiserver built from Go modules,
both on loopback, with certificates and an admin kubeconfig made by the real kubeadm.
Admission is the real one (ResourceQuota included), authorization is RBAC."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.support.mirror_fixture import free_port

ETCD = "etcd"


def _wait_port(port: int, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}; see {log}:\n{log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"port {port} not listening after {timeout}s; see {log}")


@dataclass
class ApiServer:
    root: Path
    bin_dir: Path
    port: int = 0
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.conf"

    def kubectl(self, *args: str, as_user: str | None = None, groups: tuple[str, ...] = (),
                stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        if as_user:
            argv += ["--as", as_user] + [f"--as-group={g}" for g in groups]
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def wait_for(self, *args: str, jsonpath: str, timeout: float = 60) -> str:
        """Poll `kubectl get ARGS -o jsonpath=...` until it prints something."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.kubectl("get", *args, "-o", f"jsonpath={jsonpath}", check=False)
            if proc.returncode == 0 and proc.stdout.strip():
                return proc.stdout
            time.sleep(0.3)
        raise AssertionError(f"kubectl get {' '.join(args)} never showed {jsonpath}")

    def apply_crds(self, objects: list[dict]) -> None:
        """A chart's CRDs applied server-side, as gpuboot applies them, and waited for."""
        crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
        self.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=yaml.safe_dump_all(crds))
        self.established(*(crd["metadata"]["name"] for crd in crds))

    def established(self, *names: str, timeout: float = 60) -> None:
        """Wait until every named CRD is Established. Polled: `kubectl wait` on a CRD created a
        moment ago fails outright while its status has no conditions yet."""
        deadline = time.monotonic() + timeout
        waiting = set(names)
        while waiting and time.monotonic() < deadline:
            proc = self.kubectl("get", "crd", *sorted(waiting), "-o", "json", check=False)
            if proc.returncode == 0:
                found = json.loads(proc.stdout)
                for crd in found.get("items", [found]):
                    if any(c.get("type") == "Established" and c.get("status") == "True"
                           for c in (crd.get("status") or {}).get("conditions") or []):
                        waiting.discard(crd["metadata"]["name"])
            if waiting:
                time.sleep(0.3)
        if waiting:
            raise AssertionError(f"CRDs not Established after {timeout} s: {', '.join(sorted(waiting))}")

    def apply_node(self, name: str, labels: dict[str, str]) -> None:
        """A Node as a kubelet registers it, with the labels NFD would add, applied as NFD would."""
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                      "kubernetes.io/arch": "amd64", **labels}}}
        self.kubectl("apply", "--server-side", "--field-manager=nfd", "-f", "-", stdin=json.dumps(node))

    def clean_slate(self, namespace: str, kinds: str, namespace_file: Path) -> None:
        """The namespace and every object of `kinds` (Nodes among them) deleted, and the
        namespace applied again: one case does not see the last one's objects."""
        self.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", "--timeout=120s")
        self.kubectl("delete", kinds, "--all", "--wait=true")
        self.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", str(namespace_file))

    def start(self) -> ApiServer:
        etcd_port, peer_port = free_port(), free_port()
        self.port = free_port()
        pki = self._certificates()
        etcd_log = self.root / "etcd.log"
        with open(etcd_log, "wb") as out:
            etcd = subprocess.Popen([shutil.which(ETCD) or ETCD, "--data-dir", str(self.root / "etcd"),
                                     "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                                     "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                                     "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                                     "--initial-cluster", f"default=http://127.0.0.1:{peer_port}"],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(etcd)
        _wait_port(etcd_port, etcd, etcd_log, 20)
        api_log = self.root / "apiserver.log"
        with open(api_log, "wb") as out:
            api = subprocess.Popen([
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
                # 1.37 refuses a loopback address for the kubernetes Service endpoints; no pod
                # here needs that Service, so nothing reconciles it.
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
                f"--client-ca-file={pki}/ca.crt",
                f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/12", "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",  # as kubeadm sets it: pod security decides per namespace
                "--enable-admission-plugins=NamespaceLifecycle,ResourceQuota,LimitRanger,ServiceAccount",
                f"--cert-dir={self.root / 'apiserver-certs'}",
            ], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(api)
        _wait_port(self.port, api, api_log, 60)
        self._write_kubeconfig(pki)
        # The controllers API behaviour depends on: quota status (admission enforces only a
        # quota the controller has seen), aggregated roles (edit, view), service accounts.
        cm_log = self.root / "controller-manager.log"
        with open(cm_log, "wb") as out:
            self.processes.append(subprocess.Popen([
                str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
                "--controllers=resourcequota-controller,serviceaccount-controller,clusterrole-aggregation-controller,"
                "namespace-controller,garbage-collector-controller",
                f"--service-account-private-key-file={pki}/sa.key", f"--root-ca-file={pki}/ca.crt",
                "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            ], stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # ready means RBAC's bootstrap roles exist
            if self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0:
                return self
            time.sleep(0.5)
        raise RuntimeError(f"API server not ready; see {api_log}")

    def _certificates(self) -> Path:
        """kubeadm's own certs and admin kubeconfig phases, into a scratch root."""
        rootfs = self.root / "rootfs"
        rootfs.mkdir(parents=True)
        (rootfs / "kubeadm.yaml").write_text(yaml.safe_dump_all([
            {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
             # kubeadm refuses a loopback advertise address; the server listens on loopback anyway.
             "localAPIEndpoint": {"advertiseAddress": "192.0.2.10", "bindPort": self.port},
             "nodeRegistration": {"name": "api-fixture"}},
            {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
             "controlPlaneEndpoint": f"127.0.0.1:{self.port}",
             "apiServer": {"certSANs": ["127.0.0.1"]}},
        ]))
        # super-admin (system:masters): admin.conf's group is only bound by a full kubeadm init.
        for phase in (["certs", "all"], ["kubeconfig", "super-admin"]):
            subprocess.run([str(self.bin_dir / "kubeadm"), "init", "phase", *phase, "--config", "/kubeadm.yaml",
                            "--rootfs", str(rootfs)], check=True, capture_output=True, text=True)
        return rootfs / "etc" / "kubernetes" / "pki"

    def _write_kubeconfig(self, pki: Path) -> None:  # noqa: ARG002 (the CA is inside it)
        shutil.copy(self.root / "rootfs" / "etc" / "kubernetes" / "super-admin.conf", self.kubeconfig)
        self.kubeconfig.chmod(0o600)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
