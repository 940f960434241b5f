"""Runs a list of phases in order: lock, fingerprints, one playbook per phase, state.

Re-running is the resume: a phase that succeeded with identical inputs is skipped
(--force runs it anyway), and every playbook converges from the hosts' real state."""
from __future__ import annotations

import hashlib
import queue
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Protocol

from gpuboot import content
from gpuboot.ansible.runner import PlaybookResult, PlaybookRun, run_playbook
from gpuboot.config.model import Cluster
from gpuboot.errors import Interrupted, PhaseFailed
from gpuboot.events import (Event, Failure, HostResult, PhaseFinished, PhaseSkipped, PhaseStarted,
                            PlaybookStats, RunFinished, RunStarted)
from gpuboot.phases.catalog import Phase, hosts_for
from gpuboot.runlog import RunLog, tee
from gpuboot.state import ClusterState, new_run_id


class Sink(Protocol):
    def __call__(self, event: Event) -> None: ...


Runner = Callable[[PlaybookRun, Callable[[Event], None], threading.Event], PlaybookResult]


@dataclass(frozen=True)
class RunOptions:
    command: str = "up"
    action: str = "install"
    check: bool = False
    diff: bool = False
    force: bool = False
    host_key_checking: bool = True
    verbosity: int = 0
    resume_hint: str = "gpuboot up {inventory} --from {phase}"
    extravars: tuple[tuple[str, object], ...] = ()  # more run-wide extra vars, as data
    record_state: bool = True  # False for runs that change nothing on hosts (render)


@lru_cache(maxsize=None)
def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for sub in ("playbooks", "roles", "mirror"):
        for path in sorted((root / sub).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and ".molecule" not in path.parts:
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def fingerprint(cluster: Cluster, phase: Phase, options: RunOptions) -> str:
    digest = hashlib.sha256()
    digest.update(f"{phase.name}|{options.action}".encode())
    for source in cluster.source_files:
        digest.update(source.encode())
        digest.update(Path(source).read_bytes())
    digest.update(_tree_digest(content.content_dir()).encode())
    return digest.hexdigest()


def ssh_defaults(cluster: Cluster) -> dict[str, str]:
    """gpuboot.ssh as Ansible's configuration defaults: the lowest precedence, so a host's or
    group's own ansible_user, ansible_port, ... in the inventory still wins."""
    ssh = cluster.settings.ssh
    env = {"ANSIBLE_REMOTE_USER": ssh.user, "ANSIBLE_REMOTE_PORT": str(ssh.port)}
    if ssh.private_key_file:
        key = Path(ssh.private_key_file).expanduser()
        env["ANSIBLE_PRIVATE_KEY_FILE"] = str(key if key.is_absolute() else Path(cluster.inventory).parent / key)
    if ssh.jump_host:
        jump = next((n for n in cluster.nodes if n.name == ssh.jump_host), None)
        target = f"{ssh.user}@{jump.address}:{jump.port}" if jump else f"{ssh.user}@{ssh.jump_host}"
        env["ANSIBLE_SSH_COMMON_ARGS"] = f"-o ProxyJump={target}"
    return env


def forks_for(cluster: Cluster) -> int:
    return max(1, min(len(cluster.nodes), 64))


@dataclass
class Engine:
    cluster: Cluster
    state: ClusterState
    options: RunOptions
    sink: Sink
    runner: Runner = run_playbook
    failures: list[Failure] = field(default_factory=list)
    last_stats: PlaybookStats | None = None

    def __post_init__(self) -> None:
        self.sink = tee(RunLog(), self.sink)

    def _envvars(self, run_dir: Path) -> dict[str, str]:
        root = content.content_dir()
        env = {
            "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(root / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            # SSH masters are shared by the phases of one run, never across runs: a reused
            # master would skip host-key verification for a host whose key has changed.
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(Path.home() / ".ansible" / "cp" / run_dir.name),
            # ansible-runner turns host-key checking off unless told otherwise.
            "ANSIBLE_HOST_KEY_CHECKING": "True" if self.options.host_key_checking else "False",
        }
        env.update(ssh_defaults(self.cluster))
        return env

    def _run_phase(self, phase: Phase, run_dir: Path, run_id: str) -> PlaybookResult:
        request = PlaybookRun(
            playbook=phase.path,
            inventory=Path(self.cluster.inventory).resolve(),
            artifact_dir=run_dir / "phases",
            ident=phase.name,
            extravars={"gpuboot_action": self.options.action, "gpuboot_run_id": run_id,
                       # The admin kubeconfig (0600) lives beside the cluster's state.
                       "gpuboot_kubeconfig": str(self.state.root / "admin.conf"),
                       **dict(self.options.extravars)},
            envvars=self._envvars(run_dir),
            forks=forks_for(self.cluster),
            check=self.options.check,
            diff=self.options.diff,
            verbosity=self.options.verbosity,
            fact_cache=run_dir / "facts",
        )
        events: queue.Queue[Event | None] = queue.Queue()
        cancel = threading.Event()
        outcome: list[PlaybookResult | BaseException] = []

        def work() -> None:
            try:
                outcome.append(self.runner(request, events.put, cancel))
            except BaseException as exc:  # surfaced in the main thread below
                outcome.append(exc)
            finally:
                events.put(None)

        worker = threading.Thread(target=work, name=f"phase-{phase.name}", daemon=True)
        worker.start()
        try:
            while True:
                try:
                    event = events.get(timeout=0.2)
                except queue.Empty:
                    continue
                if event is None:
                    break
                if isinstance(event, PlaybookStats):
                    self.last_stats = event
                if isinstance(event, HostResult) and event.status in ("failed", "unreachable"):
                    self.failures.append(Failure(event.host, event.task, event.message))
                self.sink(event)
        except KeyboardInterrupt:
            cancel.set()
            worker.join(timeout=60)
            raise Interrupted(f"interrupted during phase {phase.name}",
                              hint=self.options.resume_hint.format(inventory=self.cluster.inventory, phase=phase.name))
        worker.join()
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def run(self, phases: list[Phase]) -> RunFinished:
        run_id = new_run_id()
        run_dir = self.state.run_dir(run_id)
        log = run_dir / "gpuboot.log"
        started = time.monotonic()
        names = [p.name for p in phases]
        self.sink(RunStarted(run_id, self.cluster.settings.cluster_name, names, str(log)))
        ran: list[str] = []
        status = "ok"
        resume = None
        record = self.state.load()["phases"]
        try:
            with self.state.lock(self.options.command):
                for index, phase in enumerate(phases, start=1):
                    digest = fingerprint(self.cluster, phase, self.options)
                    previous = record.get(phase.name, {})
                    if (not self.options.force and not self.options.check and previous.get("status") == "ok"
                            and previous.get("fingerprint") == digest):
                        self.sink(PhaseSkipped(phase.name, f"up to date since {previous.get('at')} (--force runs it)"))
                        continue
                    hosts = hosts_for(self.cluster, phase.hosts)
                    if not hosts:
                        self.sink(PhaseSkipped(phase.name, f"no hosts in {phase.hosts}"))
                        continue
                    self.sink(PhaseStarted(phase.name, phase.title, hosts, index, len(phases)))
                    t0 = time.monotonic()
                    self.last_stats = None
                    result = self._run_phase(phase, run_dir, run_id)
                    ran.append(phase.name)
                    changed = sum(c.changed for c in (self.last_stats.hosts.values() if self.last_stats else []))
                    failed_hosts = sorted({f.host for f in self.failures})
                    phase_ok = result.ok
                    self.sink(PhaseFinished(phase.name, "ok" if phase_ok else "failed", changed,
                                            failed_hosts, round(time.monotonic() - t0, 2)))
                    if not self.options.check and self.options.record_state:
                        self.state.record_phase(phase.name, status="ok" if phase_ok else "failed",
                                                fingerprint=digest, run_id=run_id, changed=changed)
                    if not phase_ok:
                        status = "failed"
                        resume = self.options.resume_hint.format(inventory=self.cluster.inventory, phase=phase.name)
                        if not self.failures:
                            self.failures.append(Failure("-", phase.name,
                                                         f"ansible-playbook ended with {result.status} (rc {result.rc}); see {result.stdout_path}"))
                        break
        except Interrupted as exc:
            status, resume = "interrupted", exc.hint
        finished = RunFinished(run_id, status, ran, list(self.failures), str(log), resume,
                               round(time.monotonic() - started, 2))
        self.state.record_run({"run_id": run_id, "command": self.options.command, "status": status,
                               "phases": ran, "seconds": finished.seconds,
                               "check": self.options.check})
        self.sink(finished)
        return finished


def raise_for(finished: RunFinished) -> None:
    """Turn a failed run into the typed error the CLI maps to an exit code."""
    if finished.status == "interrupted":
        raise Interrupted("run interrupted", hint=finished.resume)
    if finished.status == "failed":
        first = finished.failures[0] if finished.failures else None
        what = f"{first.host}: {first.task}" if first else "a phase"
        raise PhaseFailed(f"run failed at {what}", hint=finished.resume)
