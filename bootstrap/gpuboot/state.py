"""What finished, per cluster, under <state dir>/<cluster>/ — never a secret.

state.json records each phase's last outcome and the fingerprint of its inputs;
runs/<run-id>/ holds each run's log and ansible-runner artifacts."""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuboot.errors import LockedError

STATE_ENV = "GPUBOOT_STATE_DIR"


def state_root(explicit: str | Path | None = None, default: str | Path = ".gpuboot") -> Path:
    return Path(explicit or os.environ.get(STATE_ENV) or default).resolve()


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)


@dataclass
class ClusterState:
    root: Path

    @classmethod
    def for_cluster(cls, state_dir: Path, cluster: str) -> ClusterState:
        root = state_dir / cluster
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        return cls(root)

    @property
    def file(self) -> Path:
        return self.root / "state.json"

    def run_dir(self, run_id: str) -> Path:
        path = self.root / "runs" / run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def load(self) -> dict:
        if not self.file.exists():
            return {"phases": {}, "runs": []}
        return json.loads(self.file.read_text())

    def save(self, data: dict) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, self.file)

    def record_phase(self, name: str, **fields: object) -> None:
        data = self.load()
        data["phases"][name] = {**fields, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        self.save(data)

    def record_run(self, run: dict, keep: int = 50) -> None:
        data = self.load()
        data["runs"] = [r for r in data["runs"] if r.get("run_id") != run.get("run_id")] + [run]
        data["runs"] = data["runs"][-keep:]
        self.save(data)

    @contextmanager
    def lock(self, command: str) -> Iterator[None]:
        """One run per cluster at a time; the lock dies with the process that holds it."""
        path = self.root / "lock"
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise LockedError(f"cluster {self.root.name} is locked by {holder}",
                              hint="wait for that run to finish; the lock is released when its process exits") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} ({command}) since {time.strftime('%H:%M:%S')}")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
