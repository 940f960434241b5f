"""A reader of the API through the control-plane endpoint while something disruptive runs
(an upgrade): /readyz every `interval` seconds, and every few reads the workload's pods that
are Ready (kubelet's own word, not a controller's count: a Deployment's availableReplicas
dips while a restarted controller manager catches up, with every pod still serving). Counts
failed reads and measures the longest window with no answer."""
from __future__ import annotations

import base64
import json
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass
class ProbeFigures:
    reads: int = 0
    failures: int = 0
    longest_gap: float = 0.0
    min_ready: int | None = None
    pod_reads: int = 0
    failed_reasons: dict[str, int] = field(default_factory=dict)
    # The first reads at the lowest count: when (the clock, as in gpuboot's run log) and each pod as read
    # (node, Ready, the condition's reason), so a dip can be told from a drain or a starved node.
    lowest: list[tuple[str, list[str]]] = field(default_factory=list)


class ApiProbe:
    def __init__(self, kubeconfig: Path, pods: tuple[str, str] | None = None, interval: float = 0.2) -> None:
        """pods: (namespace, label selector) of the workload to watch."""
        config = yaml.safe_load(kubeconfig.read_text())
        cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
        self.server = cluster["server"]
        self.context = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        self._keys = tempfile.TemporaryDirectory()
        cert, key = Path(self._keys.name) / "c.pem", Path(self._keys.name) / "k.pem"
        for path, value in ((cert, user["client-certificate-data"]), (key, user["client-key-data"])):
            path.touch(mode=0o600)
            path.write_bytes(base64.b64decode(value))
        self.context.load_cert_chain(cert, key)
        self.pods = pods
        self.interval = interval
        self.figures = ProbeFigures()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="api-probe", daemon=True)

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.server + path, context=self.context, timeout=1.0) as answer:
            return answer.read()

    def _loop(self) -> None:
        last_answer = time.monotonic()
        while not self._stop.is_set():
            started = time.monotonic()
            self.figures.reads += 1
            try:
                self._get("/readyz")
                last_answer = time.monotonic()
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                self.figures.failures += 1
                reason = type(getattr(exc, "reason", exc)).__name__
                self.figures.failed_reasons[reason] = self.figures.failed_reasons.get(reason, 0) + 1
            self.figures.longest_gap = max(self.figures.longest_gap, time.monotonic() - last_answer)
            if self.pods and self.figures.reads % 5 == 0:
                self._read_pods()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def _read_pods(self) -> None:
        namespace, selector = self.pods
        try:
            body = json.loads(self._get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}"))
        except (urllib.error.URLError, OSError, TimeoutError, ValueError):
            return  # counted by the /readyz reads
        pods = body.get("items", [])
        ready = sum(1 for pod in pods if not pod["metadata"].get("deletionTimestamp") and _ready(pod)[0] == "True")
        self.figures.pod_reads += 1
        current = self.figures.min_ready
        if current is None or ready < current:
            self.figures.lowest = []
        if (current is None or ready <= current) and len(self.figures.lowest) < 5:
            self.figures.lowest.append((time.strftime("%H:%M:%S"), [_describe(p) for p in pods]))
        self.figures.min_ready = ready if current is None else min(current, ready)

    def __enter__(self) -> ApiProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._keys.cleanup()


def _ready(pod: dict) -> tuple[str, str]:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == "Ready":
            return condition["status"], condition.get("reason", "")
    return "Unknown", "no Ready condition"


def _describe(pod: dict) -> str:
    status, reason = _ready(pod)
    deleting = " deleting" if pod["metadata"].get("deletionTimestamp") else ""
    return f"{pod['metadata']['name']}@{pod['spec'].get('nodeName', '-')} ready={status} {reason}{deleting}".strip()
