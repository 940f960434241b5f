"""What `up` would do, per phase and host, from the inventory and recorded state."""
from __future__ import annotations

from gpuboot.config.model import Cluster
from gpuboot.phases.catalog import Phase
from gpuboot.phases.engine import RunOptions, fingerprint
from gpuboot.state import ClusterState


def hosts_for(cluster: Cluster, pattern: str) -> list[str]:
    """Resolve the simple patterns the catalog uses: group, group[0], group[1:], a:b."""
    hosts: list[str] = []
    for part in pattern.split(":"):
        group, _, index = part.partition("[")
        members = [n.name for n in cluster.nodes if group in n.groups]
        if index:
            index = index.rstrip("]")
            if ":" in index:
                start, _, end = index.partition(":")
                members = members[int(start or 0): int(end) if end else None]
            else:
                members = members[int(index): int(index) + 1]
        hosts += [h for h in members if h not in hosts]
    return hosts


def describe(cluster: Cluster, phases: list[Phase], state: ClusterState) -> list[dict]:
    record = state.load()["phases"]
    rows = []
    for phase in phases:
        previous = record.get(phase.name, {})
        if not phase.implemented:
            action = "NOT IMPLEMENTED: up stops here"
        elif previous.get("status") == "ok" and previous.get("fingerprint") == fingerprint(cluster, phase, RunOptions()):
            action = "up to date (skipped unless --force)"
        elif previous.get("status") == "failed":
            action = "run again (failed last time)"
        else:
            action = "run"
        rows.append({"phase": phase.name, "title": phase.title, "playbook": f"playbooks/{phase.playbook}",
                     "hosts": hosts_for(cluster, phase.hosts), "action": action})
    return rows
