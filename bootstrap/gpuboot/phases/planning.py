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
            action = "skipped if every host still shows its result (inputs unchanged); " + _repair_scope(cluster, phase)
        elif previous.get("status") == "failed":
            action = "run again (failed last time)"
        elif previous:
            action = "run (its playbook, roles or inputs changed)"
        else:
            action = "run"
        row = {"phase": phase.name, "title": phase.title, "playbook": f"playbooks/{phase.playbook}",
               "hosts": hosts, "action": action}
        if phase.gate:
            row["demands"] = gate_demands(cluster)
        if hosts and phase.notes(cluster):
            row["notes"] = phase.notes(cluster)
        rows.append(row)
    return rows


def _repair_scope(cluster: Cluster, phase: Phase) -> str:
    """Where a repair of this phase runs when only some hosts lost its result (engine._plan)."""
    if not phase.repairs_per_host:
        return "else on every host (one host's result depends on every other's)"
    needed = phase.hosts_by_position(cluster)
    return "else on the hosts that lost it" + (f" and {', '.join(needed)}, which it needs" if needed else "")


def _listed(resources: dict[str, int | None]) -> str:
    return ", ".join(f"{name}={'>0' if count is None else count}" for name, count in sorted(resources.items()))


def gate_demands(cluster: Cluster) -> dict[str, list[str]]:
    """What the validate gate will demand of each GPU and fabric node, as the inventory implies
    it: allocatable GPUs or MIG devices, GPU Feature Discovery's labels, the operand pods that
    must run there, the RDMA and VF resources."""
    demands: dict[str, list[str]] = {}
    for name, node in cluster.gpu_plan.as_data()["nodes"].items():
        resources, per_gpu = node["resources"], node["per_gpu"]
        if resources is not None:
            lines = [f"allocatable {_listed(resources)}"]
        elif per_gpu:
            lines = ["allocatable " + ", ".join(f"{k}={v} x the GPUs found on the node" for k, v in sorted(per_gpu.items()))
                     + " (gpu.count not declared)"]
        else:
            lines = ["allocatable nvidia.com/* > 0 (gpu.count not declared)"]
        if node["gfd_labels"]:
            lines.append("labels " + ", ".join(f"{k.removeprefix('nvidia.com/')}={v}" for k, v in sorted(node["gfd_labels"].items())))
        lines.append(f"operand pods: {', '.join(node['operands'])}")
        demands[name] = lines
    fabric = cluster.nic_plan
    for name in fabric.node_labels():
        if resources := fabric.node_resources(name):
            demands.setdefault(name, []).append(f"fabric {_listed(resources)}")
    return dict(sorted(demands.items()))
