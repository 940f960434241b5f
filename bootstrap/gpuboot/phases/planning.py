"""What `up` would do, per phase and host, from the inventory and recorded state. It
touches no host: whether a phase with unchanged inputs is really skipped, `up` asks the
hosts (their answer is what `plan --check` and `up` show)."""
from __future__ import annotations

from gpuboot.config.model import Cluster
from gpuboot.phases.catalog import Phase
from gpuboot.phases.convergence import fingerprint
from gpuboot.state import ClusterState


def describe(cluster: Cluster, phases: list[Phase], state: ClusterState) -> list[dict]:
    record = state.load()["phases"]
    rows = []
    stopped = None
    for phase in phases:
        previous = record.get(phase.name, {})
        hosts = phase.hosts_in(cluster)
        stops = phase.stops_because(cluster.settings)
        if stopped:
            action = f"not reached: up stops at {stopped}"
        elif not hosts:
            action = f"skipped: no hosts in {phase.hosts}"
        elif phase.idle(cluster):
            action = f"skipped: nothing to do ({phase.idle(cluster)})"
        elif stops:
            action = f"stops: {stops}"
            stopped = phase.name
        elif previous.get("status") == "ok" and previous.get("fingerprint") == fingerprint(cluster, phase, hosts):
            action = "skipped if every host still shows its result (inputs unchanged)"
        elif previous.get("status") == "failed":
            action = "run again (failed last time)"
        elif previous:
            action = "run (its playbook, roles or inputs changed)"
        else:
            action = "run"
        rows.append({"phase": phase.name, "title": phase.title, "playbook": f"playbooks/{phase.playbook}",
                     "hosts": hosts, "action": action})
    return rows
