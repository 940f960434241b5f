"""Convergence that follows the hosts.

A phase is skipped only when its own playbook, roles and inputs are unchanged since it last
succeeded AND every one of its hosts still shows its result (gpuboot_phase_state: the
record the phase left, the files it owns unchanged, its services active). The question is
asked of all hosts at once, in one Ansible run that also takes the cluster lock on the
first control plane; a second one at the end records what the phases left and releases it."""
from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuboot import content
from gpuboot.config.model import Cluster, GpubootSettings
from gpuboot.phases.catalog import Phase

STATE_PLAYBOOK = "gpuboot_state.yml"


def _tree_digest(path: Path) -> str:
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if {"__pycache__", "molecule", ".molecule"} & set(file.parts):
            continue
        digest.update(str(file.relative_to(path.parent)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def fingerprint(cluster: Cluster, phase: Phase, hosts: list[str]) -> str:
    """The phase's own content (playbook, roles, shared playbook vars, task files and modules,
    the release matrix) and its inputs (validated settings, its hosts' inventory variables).
    Editing one role changes only the phases that use it."""
    root = content.content_dir()
    digest = hashlib.sha256(phase.name.encode())
    shared = [root / "playbooks" / name for name in ("group_vars", "tasks", "library", "module_utils")]
    parts = [root / "playbooks" / phase.playbook, *shared, root / "mirror" / "releases" / f"{cluster.settings.release}.yml"]
    parts += [root / "roles" / role for role in phase.roles]
    for part in parts:
        if part.exists():
            digest.update(_tree_digest(part).encode())
    inputs = {"settings": cluster.settings.model_dump(mode="json"),
              "hosts": {h: cluster.host_inputs(h) for h in hosts}}
    digest.update(json.dumps(inputs, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def holder(run_id: str, command: str, state_root: Path) -> dict:
    return {"run_id": run_id, "who": getpass.getuser(), "where": socket.gethostname(), "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command, "state_dir": str(state_root)}


def is_dead(other: dict, finished_runs: set[str]) -> bool:
    """A holder we can prove is gone: a run our state records as finished, or a process on
    this machine that no longer exists. A run elsewhere is never presumed dead."""
    if other.get("run_id") in finished_runs:
        return True
    if other.get("where") != socket.gethostname():
        return False
    try:
        os.kill(int(other.get("pid", 0)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, TypeError):
        return False
    return False


def describe_holder(other: dict) -> str:
    return (f"{other.get('who', '?')}@{other.get('where', '?')} (pid {other.get('pid', '?')}, "
            f"`gpuboot {other.get('command', '?')}`, run {other.get('run_id', '?')}) since {other.get('since', '?')}")


@dataclass
class Probe:
    """What the hosts said: per phase, per host, why its result is gone (empty: converged)."""

    reasons: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    unreachable: set[str] = field(default_factory=set)

    def converged(self, phase: str, hosts: list[str]) -> tuple[bool, str]:
        answers = self.reasons.get(phase, {})
        for host in hosts:
            if host in self.unreachable:
                return False, f"{host} did not answer"
            if host not in answers:
                return False, f"{host} was not asked"
            if answers[host]:
                return False, f"{host}: {answers[host][0]}"
        return True, ""

    def drifted(self, phase: str, hosts: list[str]) -> list[str] | None:
        """The hosts that answered that the phase's result is gone, or None when a host did not
        answer or was not asked (then nobody knows what it needs: the whole phase runs)."""
        answers = self.reasons.get(phase, {})
        if any(host in self.unreachable or host not in answers for host in hosts):
            return None
        return [host for host in hosts if answers[host]]


def probe_from(results: list, phases: list[str]) -> Probe:
    """Collect the probe task's per-host answers (HostResult.data) into a Probe."""
    probe = Probe({name: {} for name in phases})
    for result in results:
        if result.status == "unreachable":
            probe.unreachable.add(result.host)
        elif isinstance(result.data, dict) and result.task.endswith("check each phase's result"):
            for name, why in result.data.items():
                probe.reasons.setdefault(name, {})[result.host] = list(why)
    return probe


def state_phases(entries: list[tuple[Phase, str, list[str]]], settings: GpubootSettings) -> list[dict]:
    """The phases as the state playbook takes them: name, fingerprint, hosts and result."""
    found = []
    for phase, digest, hosts in entries:
        result = phase.result_for(settings)
        if result.observable and hosts:
            found.append({"name": phase.name, "fingerprint": digest, "hosts": hosts, **result.as_data()})
    return found
