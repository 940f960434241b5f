"""What the operator doubles share: the lab's API server through the real kubectl, and a
reconcile loop run as a controller (errors kept for the test to read, never raised)."""
from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import yaml


class DoubleController:
    name = "double-controller"

    def __init__(self, kubectl: Path, kubeconfig: Path) -> None:
        self.kubectl, self.kubeconfig = kubectl, kubeconfig
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    # -- the API server, through the real kubectl --------------------------------
    def _run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.kubectl), "--kubeconfig", str(self.kubeconfig), "--request-timeout=10s", *args],
                              input=stdin, capture_output=True, text=True, timeout=30)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:3])}: {proc.stderr.strip()}")
        return proc

    def _get(self, *args: str) -> dict | None:
        proc = self._run("get", *args, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def _apply(self, objects: list[dict]) -> None:
        if objects:
            self._run("apply", "--server-side", f"--field-manager={self.name}", "--force-conflicts", "-f", "-",
                      stdin="\n---\n".join(yaml.safe_dump(o) for o in objects))

    def reconcile(self) -> str | None:
        raise NotImplementedError

    # -- as a controller -----------------------------------------------------------
    def start(self, period: float = 2.0):
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.reconcile()
                except Exception as exc:  # noqa: BLE001 - a controller retries; the test reads .errors
                    self.errors.append(str(exc))
                self._stop.wait(period)

        self._thread = threading.Thread(target=loop, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()
