"""What `up` would do, per phase and host, from the inventory and recorded state."""
from __future__ import annotations

from gpuboot.config.model import Cluster
from gpuboot.phases.catalog import Phase, hosts_for
from gpuboot.phases.engine import RunOptions, fingerprint
from gpuboot.state import ClusterState


def describe(cluster: Cluster, phases: list[Phase], state: ClusterState) -> list[dict]:
    record = state.load()["phases"]
    rows = []
    for phase in phases:
        previous = record.get(phase.name, {})
        hosts = hosts_for(cluster, phase.hosts)
        if not hosts:
            action = f"skipped: no hosts in {phase.hosts}"
        elif not phase.implemented:
            action = "NOT IMPLEMENTED: up stops here"
        elif previous.get("status") == "ok" and previous.get("fingerprint") == fingerprint(cluster, phase, RunOptions()):
            action = "up to date (skipped unless --force)"
        elif previous.get("status") == "failed":
            action = "run again (failed last time)"
        else:
            action = "run"
        rows.append({"phase": phase.name, "title": phase.title, "playbook": f"playbooks/{phase.playbook}",
                     "hosts": hosts, "action": action})
    return rows
