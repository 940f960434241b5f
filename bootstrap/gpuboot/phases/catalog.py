"""Phases are data: a name, a playbook under playbooks/, the hosts it targets, its tags.

A phase's playbook is the single source of truth for whether it is built yet: a
placeholder playbook sets `gpuboot_phase_not_implemented` and fails loudly."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuboot import content
from gpuboot.config.model import Cluster

NOT_IMPLEMENTED_MARKER = "gpuboot_phase_not_implemented"
CLUSTER = "control_plane:workers"


@dataclass(frozen=True)
class Phase:
    name: str
    title: str
    playbook: str
    hosts: str
    tags: tuple[str, ...] = ()
    # The matrix components whose images nodes pull in this phase, and whether it installs
    # packages: in an air gap the mirror must hold them first.
    pulls: tuple[str, ...] = ()
    installs_packages: bool = False

    def pulls_for(self, cluster: Cluster) -> tuple[str, ...]:
        # The bridge CNI is plugins from a package; only Calico pulls images.
        if cluster.settings.networking.cni != "calico":
            return tuple(c for c in self.pulls if c != "calico")
        return self.pulls

    @property
    def path(self) -> Path:
        return content.playbook(self.playbook)

    @property
    def implemented(self) -> bool:
        plays = yaml.safe_load(self.path.read_text()) or []
        return not any(NOT_IMPLEMENTED_MARKER in (play.get("vars") or {}) for play in plays)


UP: tuple[Phase, ...] = (
    # Only inventories with a `mirror` group run it (a phase without hosts is skipped).
    Phase("mirror", "Air-gap mirror registry", "mirror.yml", "mirror", ("mirror",)),
    Phase("preflight", "Preflight checks", "preflight.yml", CLUSTER, ("preflight",)),
    Phase("os_prep", "OS preparation", "os_prep.yml", CLUSTER, ("os_prep",)),
    Phase("container_runtime", "Container runtime (containerd)", "container_runtime.yml", CLUSTER, ("containerd",)),
    Phase("kube_packages", "Pinned kubeadm, kubelet, kubectl", "kube_packages.yml", CLUSTER, ("kube_packages",),
          installs_packages=True),
    Phase("ha_endpoint", "HA API endpoint (VIP)", "ha_endpoint.yml", "control_plane", ("ha_endpoint",)),
    Phase("control_plane_init", "First control plane (kubeadm init)", "control_plane_init.yml", "control_plane[0]", ("kubeadm",), pulls=("kubernetes",)),
    Phase("control_plane_join", "Control-plane joins", "control_plane_join.yml", "control_plane[1:]", ("kubeadm",), pulls=("kubernetes",)),
    Phase("workers_join", "Worker joins", "workers_join.yml", "workers", ("kubeadm",), pulls=("kubernetes",)),
    Phase("cni", "Pod network (Calico, or bridge)", "cni.yml", CLUSTER, ("cni",), pulls=("calico",)),
    Phase("gpu_operator", "NVIDIA GPU Operator", "gpu_operator.yml", "control_plane[0]", ("gpu",), pulls=("gpu_operator",)),
    Phase("network_operator", "NVIDIA Network Operator", "network_operator.yml", "control_plane[0]", ("network",), pulls=("network_operator",)),
    Phase("validate", "Cluster validation", "validate.yml", "control_plane[0]", ("validate",)),
    Phase("gitops_handoff", "GitOps handoff (Argo CD)", "gitops_handoff.yml", "control_plane[0]", ("gitops",), pulls=("argocd",)),
)

CATALOGS = {"up": UP}


def by_name(catalog: tuple[Phase, ...]) -> dict[str, Phase]:
    return {p.name: p for p in catalog}


def hosts_for(cluster: Cluster, pattern: str) -> list[str]:
    """Resolve the patterns the catalog uses (group, group[0], group[1:], a:b) in inventory order."""
    hosts: list[str] = []
    for part in re.split(r":(?![^\[]*\])", pattern):
        group, _, index = part.partition("[")
        members = [n.name for n in cluster.nodes if group in n.groups]
        if index:
            index = index.rstrip("]")
            start, colon, end = index.partition(":")
            stop = (int(end) if end else None) if colon else int(start) + 1
            members = members[int(start or 0):stop]
        hosts += [h for h in members if h not in hosts]
    return hosts
