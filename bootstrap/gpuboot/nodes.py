"""`gpuboot node add|remove` and `gpuboot reset`: which hosts a change touches, decided
before anything runs.

Adding runs `up`'s node phases limited to the new hosts and the first control plane (it hands
out the join credentials); a new control plane also re-runs the HA endpoint on every control
plane (their haproxy gains a backend), and the bridge CNI adds its routes on every node.
Removing runs from another control plane and the node itself."""
from __future__ import annotations

from dataclasses import dataclass

from gpuboot.config.model import Cluster
from gpuboot.errors import UsageError
from gpuboot.phases.catalog import UP, Phase

# `up`'s phases that bring one more node into a running cluster, in order.
ADD_PHASES = ("preflight", "os_prep", "container_runtime", "kube_packages", "ha_endpoint",
              "control_plane_join", "workers_join", "cni")


@dataclass(frozen=True)
class NodeChange:
    phases: tuple[Phase, ...]
    limit: tuple[str, ...]
    unlimited: tuple[str, ...] = ()


def _known(cluster: Cluster, names: tuple[str, ...]) -> None:
    known = {n.name for n in cluster.cluster_nodes}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"not control_plane or workers hosts of {cluster.inventory}: {', '.join(unknown)}",
                         hint="add the hosts to the inventory first (the same groups and variables as their peers)")


def add(cluster: Cluster, names: tuple[str, ...]) -> NodeChange:
    if not names:
        raise UsageError("name the inventory hosts to add", hint="gpuboot node add INVENTORY HOST [HOST...]")
    _known(cluster, names)
    first = cluster.first_control_plane
    if first in names:
        raise UsageError(f"{first} is the first control plane: it founds the cluster, it is not added to one",
                         hint="put the new control plane after the existing ones in the control_plane group")
    control_planes = set(cluster.hosts_matching("control_plane"))
    new_control_planes = [n for n in names if n in control_planes]
    by_name = {p.name: p for p in UP}
    phases = [by_name[name] for name in ADD_PHASES
              if (name != "ha_endpoint" or new_control_planes)
              and (name != "control_plane_join" or new_control_planes)
              and (name != "workers_join" or set(names) - control_planes)]
    unlimited = ["ha_endpoint"] if new_control_planes else []
    if cluster.settings.networking.cni == "bridge":
        unlimited.append("cni")
    return NodeChange(tuple(phases), tuple(dict.fromkeys([first, *names])), tuple(unlimited))


def remove(cluster: Cluster, name: str, *, reachable: bool) -> tuple[str, dict]:
    """(the control plane the removal runs from, gpuboot_node_remove's data)."""
    _known(cluster, (name,))
    control_planes = cluster.hosts_matching("control_plane")
    via = next((c for c in control_planes if c != name), None)
    if via is None:
        raise UsageError(f"{name} is the only control plane: removing it removes the cluster",
                         hint="gpuboot reset INVENTORY --yes-destroy-the-cluster takes the whole cluster apart")
    return via, {"node": name, "via": via, "reachable": reachable, "control_plane": name in control_planes}
