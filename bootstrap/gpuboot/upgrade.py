"""`gpuboot upgrade`: what an upgrade will do, decided before anything changes.

The path (a tested one in the matrix, one minor at a time), the order (an etcd snapshot, the
first control plane with `kubeadm upgrade apply`, the other control planes one at a time with
`kubeadm upgrade node`, then the workers: a canary batch, then batches) and the batches
themselves are computed here, printed by `--plan`, and handed to the playbooks as data. The
hosts' own checks (versions and skew, node readiness, etcd members, PodDisruptionBudgets)
run on the first control plane in the upgrade_preflight phase.

GPU drivers are not gpuboot's to restart: where the target release moves the driver of GPU
nodes whose driver the GPU Operator manages, the last phase applies the operator's values at
the target release and follows the operator's own upgrade controller (node label
nvidia.com/gpu-driver-upgrade-state) until every such node is done, or stops at one that failed."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpuboot import gpu_plan, matrix
from gpuboot.config.model import Cluster
from gpuboot.errors import MatrixError, UpgradeRefused, UsageError

DEFAULT_DRAIN_TIMEOUT = 300
DEFAULT_GATE_TIMEOUT = 300
# How long an upgraded node must stay healthy before its gate passes: its pods come back after
# the uncordon, and one that cannot run on the new version shows it only after a restart.
DEFAULT_GATE_SETTLE = 15
# A driver container builds its modules on the node (minutes each), and NVIDIA's upgrade
# controller looks at a node again only on its two-minute requeue, several times per node: the
# driver upgrade gets this long per round of nodes it moves at once, and never under the floor.
DRIVER_TIMEOUT_PER_ROUND = 900
DRIVER_TIMEOUT_FLOOR = 3600
# The phases of an upgrade that move Kubernetes, and the one that moves GPU drivers.
KUBERNETES_PHASES = ("upgrade_control_planes", "upgrade_workers")
DRIVER_PHASE = "upgrade_gpu_driver"
_BATCH = re.compile(r"^(\d+)(%?)$")


def release_tuple(version: str) -> tuple[int, ...]:
    """v1.34.10 -> (1, 34, 10): compared as numbers, never as text."""
    return tuple(int(part) for part in version.lstrip("v").split("-", 1)[0].split("."))


def minor(version: str) -> tuple[int, int]:
    return release_tuple(version)[:2]  # type: ignore[return-value]


def batch_size(text: str, workers: int) -> int:
    """`N` workers at a time, or `N%` of them (rounded up, at least one)."""
    match = _BATCH.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise UsageError(f"--batch {text!r} is neither a count nor a percentage",
                         hint="write a whole number of workers (--batch 2) or a share of them (--batch 20%)")
    count = int(match.group(1))
    if match.group(2):
        return max(1, math.ceil(workers * min(count, 100) / 100))
    return count


def worker_batches(workers: list[str], canary: int, batch: str) -> list[list[str]]:
    """The canary batch first, then equal batches, in inventory order (Ansible's `serial`)."""
    if canary < 0:
        raise UsageError("--canary must be 0 or more workers", hint="--canary 1 upgrades one worker first")
    batches = [workers[:canary]] if canary and workers else []
    rest = workers[canary:]
    size = batch_size(batch, len(workers)) if rest else 1
    batches += [rest[i:i + size] for i in range(0, len(rest), size)]
    return batches


@dataclass(frozen=True)
class Step:
    node: str
    stage: str
    action: str


@dataclass(frozen=True)
class DriverChange:
    """A GPU node whose operator-managed driver the target release moves. `from_tag`/`to_tag`
    are how the driver image's tag starts: `<version>` for a driver container
    (`<version>-<os tag>`), `<branch>` for a precompiled one (`<branch>-<kernel>-<os tag>`)."""

    node: str
    kind: str
    from_tag: str
    to_tag: str


def _driver_tag(release: matrix.Release, kind: str) -> str:
    gpu = (release.model_extra or {}).get("gpu_operator") or {}
    key = "driver_branch" if kind == "precompiled" else "driver_version"
    if not gpu.get(key):
        raise MatrixError(f"release {release.name} names no gpu_operator.{key}",
                          hint=f"add gpu_operator.{key} to mirror/releases/{release.name}.yml")
    return str(gpu[key])


def driver_changes(cluster: Cluster, current: matrix.Release, target: matrix.Release) -> tuple[DriverChange, ...]:
    """GPU nodes whose driver image the target release changes (preinstalled drivers are the
    host's: never part of an upgrade)."""
    plan = gpu_plan.resolve(cluster.settings, target, cluster.nodes)
    changes = []
    for name, node in plan.nodes.items():
        if node.driver == "preinstalled":
            continue
        have, want = _driver_tag(current, node.driver), _driver_tag(target, node.driver)
        if have != want:
            changes.append(DriverChange(name, node.driver, have, want))
    return tuple(changes)


@dataclass(frozen=True)
class UpgradePlan:
    cluster: str
    from_release: str
    to_release: str
    from_version: str
    to_version: str
    first: str
    other_control_planes: tuple[str, ...]
    batches: tuple[tuple[str, ...], ...]
    canary: int
    drain_timeout: int
    gate_timeout: int
    resume: bool
    gpu_drivers: tuple[DriverChange, ...] = ()
    driver_timeout: int = DRIVER_TIMEOUT_FLOOR
    gate_settle: int = DEFAULT_GATE_SETTLE
    # The releases' containerd: a node takes the target's while it is drained.
    from_containerd: str = ""
    to_containerd: str = ""

    @property
    def phases(self) -> tuple[str, ...]:
        """The upgrade phases this plan runs (the driver phase only where a driver moves)."""
        return ("upgrade_preflight", "etcd_snapshot", *KUBERNETES_PHASES,
                *((DRIVER_PHASE,) if self.gpu_drivers else ()))

    def node_steps(self) -> list[str]:
        """What every node goes through, in order (a node already at the target is only gated)."""
        v = self.to_version
        containerd = (f"containerd {self.from_containerd} -> {self.to_containerd} from the mirror (held), restarted: "
                      "the DaemonSets' containers keep running" if self.from_containerd != self.to_containerd
                      else f"containerd stays {self.to_containerd} (package and configuration checked)")
        return [f"drain (DaemonSets stay, emptyDir data goes, PodDisruptionBudgets kept, {self.drain_timeout} s at most;"
                " uncordoned if anything fails)", containerd,
                f"kubeadm {v} from the mirror (held)", "its kubeadm upgrade (the step above)",
                f"kubelet and kubectl {v} from the mirror (held)", "kubelet restarted", "uncordon",
                f"gate ({self.gate_timeout} s at most): API /readyz through the endpoint, node Ready at {v}, "
                f"static pods at {v} on a control plane, every etcd member healthy, no crash-looping pod on the node, "
                f"all of it holding for {self.gate_settle} s"]

    def steps(self) -> list[Step]:
        v = self.to_version
        steps = [Step(self.first, "checks", f"tested path {self.from_release} -> {self.to_release}, one minor; "
                                            f"every node Ready at {self.from_version}; etcd healthy with every member; "
                                            "PodDisruptionBudgets allow the drains; the mirror holds "
                                            f"{self.to_release}'s images and packages"),
                 Step(self.first, "snapshot", "etcd snapshot, checked with `etcdutl snapshot status`, copied to the "
                                              "control machine (0600)"),
                 Step(self.first, "control plane", f"kubeadm upgrade apply {v} (API server, controller manager, "
                                                   "scheduler, etcd, kube-proxy, CoreDNS)")]
        steps += [Step(node, "control plane", "kubeadm upgrade node") for node in self.other_control_planes]
        for index, batch in enumerate(self.batches, 1):
            label = "canary" if index == 1 and self.canary else f"batch {index - (1 if self.canary else 0)}"
            steps += [Step(node, label, "kubeadm upgrade node") for node in batch]
        steps += [Step(c.node, "GPU driver", f"{c.kind} driver {c.from_tag} -> {c.to_tag} by the GPU Operator's "
                                             "upgrade controller (its upgradePolicy cordons, drains and restarts "
                                             "the driver; gpuboot follows nvidia.com/gpu-driver-upgrade-state and "
                                             f"stops at upgrade-failed; {self.driver_timeout} s at most in all)")
                  for c in self.gpu_drivers]
        return steps

    def as_data(self) -> dict:
        """What the upgrade playbooks read as gpuboot_upgrade."""
        return {"from_release": self.from_release, "to_release": self.to_release,
                "from_version": self.from_version, "version": self.to_version,
                "batches": [list(b) for b in self.batches], "batch_sizes": [len(b) for b in self.batches] or [1],
                "drain_timeout": self.drain_timeout, "gate_timeout": self.gate_timeout,
                "gate_settle": self.gate_settle, "resume": self.resume,
                "gpu_drivers": {c.node: c.to_tag for c in self.gpu_drivers}, "driver_timeout": self.driver_timeout}


def check_path(current: matrix.Release, target: matrix.Release) -> None:
    """A tested path, one minor at a time, never down."""
    have, want = current.kubernetes.version, target.kubernetes.version
    if have == want:
        raise UpgradeRefused(f"the inventory's release {current.name} is already Kubernetes {want}",
                             hint="nothing to upgrade; after an upgrade, set gpuboot.release to the new release")
    if release_tuple(want) < release_tuple(have):
        raise UpgradeRefused(f"{current.name} ({have}) -> {target.name} ({want}) is a downgrade",
                             hint="kubeadm does not downgrade: restore the etcd snapshot taken before the upgrade "
                                  "(gpuboot etcd restore) to go back")
    if minor(want)[1] - minor(have)[1] > 1 or minor(want)[0] != minor(have)[0]:
        raise UpgradeRefused(f"{have} -> {want} skips a minor release: kubeadm upgrades one minor at a time",
                             hint=f"upgrade to each minor in turn; tested paths to {target.name} start from: "
                                  f"{', '.join(target.upgrades_from) or 'none'}")
    if current.name not in target.upgrades_from:
        raise UpgradeRefused(f"{current.name} -> {target.name} is not a tested upgrade path in the version matrix",
                             hint=f"tested paths to {target.name} start from: {', '.join(target.upgrades_from) or 'none'} "
                                  f"(mirror/releases/{target.name}.yml upgrades_from)")


def plan_upgrade(cluster: Cluster, to_release: str, *, canary: int = 1, batch: str = "20%",
                 drain_timeout: int = DEFAULT_DRAIN_TIMEOUT, gate_timeout: int = DEFAULT_GATE_TIMEOUT,
                 resume: bool = False, driver_timeout: int | None = None,
                 gate_settle: int = DEFAULT_GATE_SETTLE) -> UpgradePlan:
    current = matrix.load(cluster.settings.release)
    target = matrix.load(to_release)
    check_path(current, target)
    unsupported = sorted(os_id for os_id in _declared_os(cluster) if not _supports(target, os_id))
    if unsupported:
        raise UpgradeRefused(f"{target.name} has no packages for {', '.join(unsupported)}",
                             hint=f"{target.name} supports: {', '.join(target.supported_os)}")
    control_planes = cluster.hosts_matching("control_plane")
    if not control_planes:
        raise UpgradeRefused("the inventory has no control_plane hosts", hint="an upgrade starts at a control plane")
    drivers = driver_changes(cluster, current, target)
    if driver_timeout is None:
        driver_timeout = default_driver_timeout(cluster, len(drivers))
    if drain_timeout < 30 or gate_timeout < 30 or driver_timeout < 30:
        raise UsageError("--drain-timeout, --gate-timeout and --driver-timeout must be at least 30 seconds")
    if not 0 <= gate_settle < gate_timeout:
        raise UsageError(f"--gate-settle {gate_settle} must be 0 or more and shorter than --gate-timeout {gate_timeout}")
    workers = [h for h in cluster.hosts_matching("workers") if h not in control_planes]
    return UpgradePlan(cluster.settings.cluster_name, current.name, target.name, current.kubernetes.version,
                       target.kubernetes.version, control_planes[0], tuple(control_planes[1:]),
                       tuple(tuple(b) for b in worker_batches(workers, canary, batch)), min(canary, len(workers)),
                       drain_timeout, gate_timeout, resume, drivers, driver_timeout,
                       gate_settle, current.containerd.version, target.containerd.version)


def default_driver_timeout(cluster: Cluster, moving: int) -> int:
    """The whole driver upgrade's budget: a round per gpu_operator.upgrade_max_parallel nodes
    (the operator's maxParallelUpgrades), the floor at least."""
    rounds = -(-moving // cluster.settings.gpu_operator.upgrade_max_parallel)
    return max(DRIVER_TIMEOUT_FLOOR, rounds * DRIVER_TIMEOUT_PER_ROUND)


def _declared_os(cluster: Cluster) -> set[str]:
    declared = {n.settings.os for n in cluster.cluster_nodes if n.settings.os}
    if cluster.settings.node_os:
        declared.add(cluster.settings.node_os.id)
    return declared


def _supports(release: matrix.Release, os_id: str) -> bool:
    try:
        release.os_for(os_id)
    except MatrixError:
        return False
    return True
