"""Runs a list of phases in order: lock, ask the hosts, one playbook per phase, record.

Re-running is the resume: a phase is skipped only when its content and inputs are
unchanged and its hosts still show its result (see convergence.py); --force runs it
anyway, and every playbook converges from the hosts' real state."""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from gpuboot import content, processes
from gpuboot.ansible.executors import SplitRunner, shares
from gpuboot.ansible.runner import PlaybookResult, PlaybookRun, run_playbook
from gpuboot.config.checks import resolve_path
from gpuboot.config.model import Cluster
from gpuboot.errors import GpubootError, Interrupted, LockedError, PhaseFailed
from gpuboot.events import (
    Event,
    Failure,
    HostResult,
    PhaseFinished,
    PhaseSkipped,
    PhaseStarted,
    PlaybookStats,
    ProcessesStopped,
    RunFinished,
    RunStarted,
)
from gpuboot.phases import convergence
from gpuboot.phases.catalog import Phase
from gpuboot.phases.inputs import phase_inputs
from gpuboot.runlog import RunLog, tee
from gpuboot.state import ClusterState, new_run_id


class Sink(Protocol):
    def __call__(self, event: Event) -> None: ...


Runner = Callable[[PlaybookRun, Callable[[Event], None], threading.Event], PlaybookResult]

# Ansible's words when ssh quit while Ansible wrote a module to its stdin (pipelining): ssh's
# own reason for quitting (a changed host key, a silent host) is not in them.
WITHOUT_SSH_REASON = ("Data could not be sent to remote host", "Broken pipe")
SSH_CHECK_PLAYBOOK = "ssh_check.yml"


@dataclass(frozen=True)
class RunOptions:
    command: str = "up"
    check: bool = False
    diff: bool = False
    force: bool = False
    host_key_checking: bool = True
    verbosity: int = 0
    resume_hint: str = "gpuboot up {inventory} --from {phase}"
    # The command's own data for its playbooks (gpuboot upgrade's plan), beside the settings.
    extravars: dict = field(default_factory=dict)
    # Only these hosts (gpuboot node add|remove), except in the phases named unlimited, which
    # run on all their hosts (the bridge CNI's routes to a new node's pods live on every node).
    limit: tuple[str, ...] = ()
    unlimited: tuple[str, ...] = ()


def ssh_defaults(cluster: Cluster) -> dict[str, str]:
    """gpuboot.ssh as Ansible's configuration defaults: the lowest precedence, so a host's or
    group's own ansible_user, ansible_port, ... in the inventory still wins."""
    ssh = cluster.settings.ssh
    env = {"ANSIBLE_REMOTE_USER": ssh.user, "ANSIBLE_REMOTE_PORT": str(ssh.port)}
    if ssh.private_key_file:
        env["ANSIBLE_PRIVATE_KEY_FILE"] = str(resolve_path(ssh.private_key_file, Path(cluster.inventory).parent))
    if ssh.jump_host:
        jump = next((n for n in cluster.nodes if n.name == ssh.jump_host), None)
        target = f"{ssh.user}@{jump.address}:{jump.port}" if jump else f"{ssh.user}@{ssh.jump_host}"
        env["ANSIBLE_SSH_COMMON_ARGS"] = f"-o ProxyJump={target}"
    return env


# Ansible's workers at once: a forked Python process each, most of it shared with its parent.
FORKS_CAP = 256


def forks_for(cluster: Cluster) -> int:
    """One worker per node. With fewer forks than hosts, Ansible's task queue polls for a free
    worker every 0.1 ms for as long as the busy ones run, which costs the control machine more
    CPU per node than the work itself as the fleet grows (docs/benchmarks.md: -16 % of the
    control CPU at 20 nodes on 2 cores). A fleet past the cap is a case for executors."""
    return max(1, min(len(cluster.nodes), FORKS_CAP))


@dataclass
class Engine:
    cluster: Cluster
    state: ClusterState
    options: RunOptions
    sink: Sink
    runner: Runner = run_playbook
    failures: list[Failure] = field(default_factory=list)
    last_stats: PlaybookStats | None = None
    # Per phase that a repair runs on some of its hosts only: those hosts (see _plan).
    repairs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Runs the node-local phases on gpuboot.executors (None: there are none).
    split: Runner | None = None

    def __post_init__(self) -> None:
        self.sink = tee(RunLog(), self.sink)
        if self.split is None and self.cluster.settings.executors:
            self.split = SplitRunner(self.cluster.settings.executors, self.cluster.settings.ssh)

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

    def _playbook(self, playbook: Path, ident: str, run_dir: Path, run_id: str, extra: dict,
                  sink: Callable[[Event], None], resume_phase: str, limit: tuple[str, ...] = (),
                  runner: Runner | None = None) -> PlaybookResult:
        request = PlaybookRun(
            playbook=playbook,
            inventory=Path(self.cluster.inventory).resolve(),
            artifact_dir=run_dir / "phases",
            ident=ident,
            extravars={**self.cluster.extravars(), "gpuboot_run_id": run_id,
                       # The admin kubeconfig (0600) lives beside the cluster's state.
                       "gpuboot_kubeconfig": str(self.state.root / "admin.conf"),
                       **self.options.extravars, **extra},
            envvars=self._envvars(run_dir),
            forks=forks_for(self.cluster),
            check=self.options.check,
            diff=self.options.diff,
            verbosity=self.options.verbosity,
            fact_cache=run_dir / "facts",
            limit=limit,
        )
        events: queue.Queue[Event | None] = queue.Queue()
        cancel = threading.Event()
        outcome: list[PlaybookResult | BaseException] = []

        def work() -> None:
            try:
                outcome.append((runner or self.runner)(request, events.put, cancel))
            except BaseException as exc:  # surfaced in the main thread below
                outcome.append(exc)
            finally:
                events.put(None)

        worker = threading.Thread(target=work, name=f"playbook-{ident}", daemon=True)
        worker.start()
        try:
            while True:
                try:
                    event = events.get(timeout=0.2)
                except queue.Empty:
                    continue
                if event is None:
                    break
                sink(event)
        except KeyboardInterrupt:
            cancel.set()
            worker.join(timeout=60)
            raise Interrupted(f"interrupted during {resume_phase}",
                              hint=self._resume_at(resume_phase)) from None
        worker.join()
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _limit_for(self, phase: Phase) -> tuple[str, ...]:
        if phase.name in self.repairs:
            return self.repairs[phase.name]
        return () if phase.name in self.options.unlimited else self.options.limit

    def _limited(self, phase: Phase, hosts: list[str]) -> list[str]:
        limit = self._limit_for(phase)
        return [h for h in hosts if h in limit] if limit else hosts

    def _phase_sink(self, event: Event) -> None:
        if isinstance(event, PlaybookStats):
            self.last_stats = event
        if isinstance(event, HostResult) and event.status in ("failed", "unreachable"):
            self.failures.append(Failure(event.host, event.task, event.message))
        self.sink(event)

    def _ask_ssh_why(self, run_dir: Path, run_id: str, phase: str, since: int) -> None:
        """With pipelining, Ansible can be writing a module to ssh's stdin when ssh gives up on the
        host (a changed host key, a host gone silent): it then reports that data could not be
        sent, not ssh's reason. Those hosts are asked once more with nothing on ssh's stdin (`raw`),
        and their failures carry what ssh said and its fix."""
        broken = {i: f for i, f in enumerate(self.failures)
                  if i >= since and any(words in f.message for words in WITHOUT_SSH_REASON)}
        if not broken:
            return
        answers: dict[str, str] = {}

        def collect(event: Event) -> None:
            if isinstance(event, HostResult) and event.status in ("unreachable", "failed"):
                answers[event.host] = event.message
        self._playbook(content.playbook(SSH_CHECK_PLAYBOOK), f"{phase}-ssh-check", run_dir, run_id,
                       {"gpuboot_ssh_hosts": sorted({f.host for f in broken.values()})}, collect, phase)
        for index, failure in broken.items():
            if failure.host in answers:
                self.failures[index] = replace(failure, message=f"{failure.message}\nssh, asked again without a "
                                                                f"module on its stdin: {answers[failure.host]}")

    def state_run(self, action: str, run_dir: Path, run_id: str, entries: list, first: str,
                   **extra: object) -> list[HostResult]:
        """gpuboot's bookkeeping on the hosts (lock, probe, record): its events are data, not progress."""
        collected: list[HostResult] = []
        hosts = sorted({h for entry in entries for h in entry["hosts"]})
        self._playbook(content.playbook(convergence.STATE_PLAYBOOK), f"state-{action}", run_dir, run_id,
                       {"gpuboot_state_action": action, "gpuboot_state_phases": entries,
                        "gpuboot_state_hosts": hosts, "gpuboot_lock_host": first, **extra},
                       lambda e: collected.append(e) if isinstance(e, HostResult) else None, "the cluster lock")
        return collected

    def _begin(self, run_dir: Path, run_id: str, first: str, entries: list, holder: dict) -> convergence.Probe:
        """Take the cluster lock on the first control plane and ask the hosts. A lock whose
        holder is provably dead is taken over once; any other holder refuses the run."""
        results = self.state_run("begin", run_dir, run_id, entries, first, gpuboot_lock_holder=holder)
        other = self._lock_holder(results, first)
        if other is not None and convergence.is_dead(other, {r["run_id"] for r in self.state.load()["runs"]}):
            results = self.state_run("begin", run_dir, run_id, entries, first, gpuboot_lock_holder=holder,
                                     gpuboot_lock_takeover=[str(other.get("run_id"))])
            other = self._lock_holder(results, first)
        if other is not None:
            raise LockedError(f"cluster {self.cluster.settings.cluster_name} is locked on {first} by "
                              f"{convergence.describe_holder(other)}",
                              hint=f"wait for that run to finish; if it is gone, run `gpuboot unlock "
                                   f"{self.cluster.inventory} --yes-the-run-is-gone` (removes /var/lib/gpuboot/lock on {first})")
        return convergence.probe_from(results, [e["name"] for e in entries])

    def _lock_holder(self, results: list[HostResult], first: str) -> dict | None:
        """None when this run holds the lock, else who does."""
        lock = next((r for r in results if r.host == first and r.task.endswith("take the cluster lock")), None)
        if lock is None or lock.status in ("failed", "unreachable") or not isinstance(lock.data, dict):
            raise GpubootError(f"cannot take the cluster lock on {first}: {lock.message if lock else 'no answer'}",
                               hint=f"the first control plane must be reachable over SSH; then re-run gpuboot {self.options.command}")
        return None if lock.data.get("acquired") else (lock.data.get("holder") or {})

    def _plan(self, phases: list[Phase], probe: convergence.Probe | None,
              digests: dict[str, str], hosts: dict[str, list[str]]) -> dict[str, tuple[bool, str]]:
        """Per phase: (skip it?, why)."""
        self.repairs.clear()
        record = self.state.load()["phases"]
        decision: dict[str, tuple[bool, str]] = {}
        for phase in phases:
            previous = record.get(phase.name, {})
            idle = phase.idle(self.cluster)
            if not hosts[phase.name]:
                decision[phase.name] = (True, f"no hosts in {phase.hosts}")
            elif idle:
                decision[phase.name] = (True, f"nothing to do: {idle}")
            elif self.options.force:
                decision[phase.name] = (False, "--force")
            elif self.options.check or probe is None:
                decision[phase.name] = (False, "")
            elif phase.gate:
                decision[phase.name] = (False, "a gate: it checks the cluster on every run")
            elif phase.read_only:
                decision[phase.name] = (False, "it checks the hosts before anything changes")
            elif previous.get("status") != "ok":
                decision[phase.name] = (False, "it has not succeeded yet" if not previous else "it failed last time")
            elif previous.get("fingerprint") != digests[phase.name]:
                decision[phase.name] = (False, "its playbook, roles or inputs changed")
            else:
                ok, why = probe.converged(phase.name, hosts[phase.name])
                decision[phase.name] = (True, f"converged: every host still shows it (since {previous.get('at')})") \
                    if ok else (False, why + self._repair_on_some(phase, probe, hosts[phase.name]))
        # A read-only phase (preflight) runs when a later phase of this run does, on the hosts
        # those phases run on.
        for index, phase in enumerate(phases):
            later = [p for p in phases[index + 1:] if not p.read_only and not p.gate]
            if phase.read_only and probe is not None and not self.options.force and later \
                    and all(decision[p.name][0] for p in later):
                decision[phase.name] = (True, "every later phase is converged")
            elif phase.read_only and probe is not None and later:
                running = [p for p in later if not decision[p.name][0]]
                if running and all(p.name in self.repairs for p in running):
                    only = tuple(dict.fromkeys(h for p in running for h in self.repairs[p.name]))
                    self.repairs[phase.name] = tuple(h for h in hosts[phase.name] if h in only)
        return decision

    def _repair_on_some(self, phase: Phase, probe: convergence.Probe, hosts: list[str]) -> str:
        """When only some of a phase's hosts lost its result, run it on those (and on the hosts
        its plays pick by position) and say so; otherwise on all its hosts, as before."""
        drifted = probe.drifted(phase.name, hosts)
        if not phase.repairs_per_host or not drifted or len(drifted) == len(hosts):
            return ""
        needed = [h for h in phase.hosts_by_position(self.cluster) if h in hosts and h not in drifted]
        chosen = set(drifted) | set(needed)
        if chosen == set(hosts):
            return ""
        self.repairs[phase.name] = tuple(h for h in hosts if h in chosen)
        return f"; only on {', '.join(drifted)}" + (f" (and {', '.join(needed)}, which it needs)" if needed else "")

    def _stop_leftovers(self) -> None:
        """Holding the state lock, no other gpuboot of this state directory is alive: any
        process still marked with one of its runs was left by a run that was killed."""
        left = processes.marked(self.state.root)
        if not left:
            return
        runs = sorted({run for pid in left if (run := processes.run_of(pid, self.state.root / "runs"))})
        self.sink(ProcessesStopped(processes.stop(left), runs))

    def _resume_at(self, phase: str) -> str:
        return self.options.resume_hint.format(inventory=self.cluster.inventory, phase=phase)

    def run(self, phases: list[Phase]) -> RunFinished:
        """Plan the phases against what the hosts still show, run those that must, record what
        succeeded on the hosts and in the state, however the run ends."""
        run_id = new_run_id()
        run_dir = self.state.run_dir(run_id)
        log = run_dir / "gpuboot.log"
        started = time.monotonic()
        names = [p.name for p in phases]
        self.sink(RunStarted(run_id, self.cluster.settings.cluster_name, names, str(log)))
        progress = _Progress()
        hosts = {p.name: self._limited(p, p.hosts_in(self.cluster)) for p in phases}
        digests = {p.name: convergence.fingerprint(self.cluster, p, hosts[p.name]) for p in phases}
        first = self.cluster.first_control_plane
        on_hosts = not self.options.check and first is not None
        holder = convergence.holder(run_id, self.options.command, self.state.root.parent)
        locked = False
        try:
            with self.state.lock(self.options.command):
                self._stop_leftovers()
                probe = None
                if on_hosts:
                    entries = convergence.state_phases([(p, digests[p.name], hosts[p.name]) for p in phases],
                                                             self.cluster.settings)
                    probe = self._begin(run_dir, run_id, first, entries, holder)
                    locked = True
                decision = self._plan(phases, probe, digests, hosts)
                for index, phase in enumerate(phases, start=1):
                    skip, why = decision[phase.name]
                    if skip:
                        self.sink(PhaseSkipped(phase.name, why))
                        continue
                    if not self._run_phase(phase, (index, len(phases)), why, run_dir, run_id,
                                           digests[phase.name], hosts[phase.name], progress):
                        break
        except Interrupted as exc:
            progress.status, progress.resume = "interrupted", exc.hint
        except KeyboardInterrupt:
            # Ctrl-C, SIGTERM or SIGHUP outside a playbook (the lock, the probe, between phases):
            # the run is still recorded, resuming at the first phase that did not succeed.
            done = {phase.name for phase, _, _ in progress.succeeded}
            pending = next((p.name for p in phases if p.name not in done), names[0] if names else "")
            progress.status, progress.resume = "interrupted", self._resume_at(pending)
        finally:
            # Record what the phases that succeeded left on their hosts, and give the lock back,
            # however the run ended (a second Ctrl-C here leaves the lock for `unlock`).
            if locked:
                self._record_on_hosts(run_dir, run_id, first, holder, progress)
        finished = RunFinished(run_id, progress.status, progress.ran, list(self.failures), str(log), progress.resume,
                               round(time.monotonic() - started, 2))
        self.state.record_run({"run_id": run_id, "command": self.options.command, "status": progress.status,
                               "phases": progress.ran, "seconds": finished.seconds,
                               "check": self.options.check})
        self.sink(finished)
        return finished

    def _run_phase(self, phase: Phase, position: tuple[int, int], why: str, run_dir: Path, run_id: str,
                   digest: str, hosts: list[str], progress: _Progress) -> bool:
        """One phase's playbook, its events and its record in the state; False when it failed.
        `position`: (its number, how many phases the run has)."""
        index, total = position
        on = list(self.repairs.get(phase.name, hosts))
        split = phase.node_local and self.split is not None
        if split:
            why += "; on the executors " + ", ".join(
                f"{executor.name} ({len(share)} hosts)" for executor, share in shares(on, self.cluster.settings.executors))
        self.sink(PhaseStarted(phase.name, phase.title, on, index, total, why))
        t0 = time.monotonic()
        self.last_stats = None
        before = len(self.failures)
        if split:
            # Split among the executors: each share's hosts are named, so the limit is the hosts.
            result = self._playbook(phase.path, phase.name, run_dir, run_id, phase_inputs(phase, self.cluster),
                                    self._phase_sink, phase.name, tuple(on), self.split)
        else:
            result = self._playbook(phase.path, phase.name, run_dir, run_id, phase_inputs(phase, self.cluster),
                                    self._phase_sink, phase.name, self._limit_for(phase))
        progress.ran.append(phase.name)
        changed = sum(c.changed for c in (self.last_stats.hosts.values() if self.last_stats else []))
        self._ask_ssh_why(run_dir, run_id, phase.name, before)
        failed_hosts = sorted({f.host for f in self.failures[before:]})
        self.sink(PhaseFinished(phase.name, "ok" if result.ok else "failed", changed,
                                failed_hosts, round(time.monotonic() - t0, 2)))
        if not self.options.check:
            self.state.record_phase(phase.name, status="ok" if result.ok else "failed",
                                    fingerprint=digest, run_id=run_id, changed=changed)
        if result.ok:
            progress.succeeded.append((phase, digest, hosts))
            return True
        progress.status, progress.resume = "failed", self._resume_at(phase.name)
        if len(self.failures) == before:
            self.failures.append(Failure("-", phase.name,
                                         f"ansible-playbook ended with {result.status} (rc {result.rc}); see {result.stdout_path}"))
        return False

    def _record_on_hosts(self, run_dir: Path, run_id: str, first: str, holder: dict, progress: _Progress) -> None:
        """The succeeded phases' results on their hosts, and the lock given back."""
        entries = convergence.state_phases(progress.succeeded, self.cluster.settings)
        try:
            recorded = self.state_run("end", run_dir, run_id, entries, first, gpuboot_lock_holder=holder)
        except (GpubootError, KeyboardInterrupt):
            recorded = []
        # A host that could not keep the record (a full /var) runs its phases again next
        # time; the run says which host and why, and fails so nobody builds on that host.
        unrecorded = [r for r in recorded if r.status == "failed" and r.task.endswith("record each phase's result")]
        for result in unrecorded:
            self.failures.append(Failure(result.host, result.task, result.message))
        if unrecorded and progress.status == "ok":
            again = next(e["name"] for e in entries if {r.host for r in unrecorded} & set(e["hosts"]))
            progress.status, progress.resume = "failed", self._resume_at(again)


@dataclass
class _Progress:
    """What a run has done so far: the phases it ran, those that succeeded (with the digest and
    hosts their record carries), and how it stands."""
    ran: list[str] = field(default_factory=list)
    succeeded: list[tuple[Phase, str, list[str]]] = field(default_factory=list)
    status: str = "ok"
    resume: str | None = None


def raise_for(finished: RunFinished) -> None:
    """Turn a failed run into the typed error the CLI maps to an exit code."""
    if finished.status == "interrupted":
        raise Interrupted("run interrupted", hint=finished.resume)
    if finished.status == "failed":
        first = finished.failures[0] if finished.failures else None
        what = f"{first.host}: {first.task}" if first else "a phase"
        raise PhaseFailed(f"run failed at {what}", hint=finished.resume)


def unlock_cluster(cluster: Cluster, state: ClusterState, runner: Runner = run_playbook) -> str | None:
    """Remove the cluster lock on the first control plane, whoever holds it; returns who did."""
    first = cluster.first_control_plane
    if first is None:
        raise GpubootError("the inventory has no control plane to hold a lock")
    engine = Engine(cluster, state, RunOptions(command="unlock"), lambda event: None, runner)
    run_id = new_run_id()
    results = engine.state_run("end", state.run_dir(run_id), run_id, [], first,
                                gpuboot_lock_holder=convergence.holder(run_id, "unlock", state.root.parent),
                                gpuboot_lock_force=True)
    release = next((r for r in results if r.task.endswith("release the cluster lock")), None)
    if release is None or release.status in ("failed", "unreachable"):
        raise GpubootError(f"cannot reach {first} to remove its lock: {release.message if release else 'no answer'}")
    holder = (release.data or {}).get("holder")
    return convergence.describe_holder(holder) if holder else None
