"""The complete artifact list of a release for one inventory: every image (the charts'
defaults plus what the operators resolve per OS, kernel and architecture at run time),
every chart and every OS package. Complete by construction: a runtime image whose inputs
are unknown is an error, never a silent omission."""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from gpuboot import gpu_plan, nic_plan
from gpuboot.config.model import Cluster
from gpuboot.errors import MirrorError
from gpuboot.matrix import Release
from gpuboot.mirror.refs import ImageRef, parse_image

# The keys of a component's matrix entry that name a chart: its CRDs' chart first where it has one.
CHART_KEYS = ("crd_chart", "chart")
PLACEHOLDER = re.compile(r"\{([a-z_]+(?:\.[a-z_]+)?)\}")


@dataclass(frozen=True)
class PlannedImage:
    ref: ImageRef
    component: str
    why: str  # "chart default" or how a runtime image was resolved


@dataclass(frozen=True)
class PlannedChart:
    component: str
    repository: str
    name: str
    version: str
    digest: str | None = None

    @property
    def mirror_repository(self) -> str:
        return f"charts/{self.name}"

    def __str__(self) -> str:
        return f"{self.name}:{self.version} ({self.repository})"


@dataclass(frozen=True)
class PlannedPackage:
    os: str
    name: str
    version: str
    why: str

    def __str__(self) -> str:
        return f"{self.os}: {self.name}={self.version}" if self.version else f"{self.os}: {self.name}"


@dataclass
class Plan:
    release: str
    images: list[PlannedImage] = field(default_factory=list)
    charts: list[PlannedChart] = field(default_factory=list)
    packages: list[PlannedPackage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def unpinned(self) -> list[str]:
        return ([str(i.ref) for i in self.images if not i.ref.digest]
                + [str(c) for c in self.charts if not c.digest])

    def only(self, components: set[str]) -> Plan:
        """The images and charts of these components (the packages stay: nodes install them)."""
        return Plan(self.release, [i for i in self.images if i.component in components],
                    [c for c in self.charts if c.component in components], list(self.packages), list(self.notes))

    def add_image(self, ref: ImageRef, component: str, why: str) -> None:
        if all(existing.ref != ref for existing in self.images):
            self.images.append(PlannedImage(ref, component, why))


@dataclass(frozen=True)
class NodeTarget:
    """What one kind of node runs, as far as the images the operators pick for it go."""

    os_key: str
    os_tag: str
    kernels: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ("amd64",)
    gpu_driver: str | None = None   # container | precompiled | preinstalled; None: no GPU
    rdma: bool = False
    precompiled: bool = False       # gpuboot.drivers.precompiled (DOCA)
    doca: bool = True               # the DOCA driver container runs (gpuboot.network_operator.driver)

    def holds(self, condition: str) -> bool:
        return {"gpu_container_driver": self.gpu_driver == "container",
                "gpu_precompiled_driver": self.gpu_driver == "precompiled",
                "rdma": self.rdma, "doca_container": self.rdma and self.doca and not self.precompiled,
                "doca_precompiled": self.rdma and self.doca and self.precompiled}[condition]


@dataclass(frozen=True)
class Target:
    """What the plan is expanded for: the kinds of nodes, and the operands the GPU
    Operator's values turn on (None: all of the release's)."""

    nodes: tuple[NodeTarget, ...] = ()
    gpu_operands: tuple[str, ...] | None = None
    network_operands: tuple[str, ...] | None = None
    # The release's optional components this cluster turns on (KAI through the GitOps handoff).
    optional: tuple[str, ...] = ()

    @property
    def os_keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n.os_key for n in self.nodes))

    @classmethod
    def of(cls, cluster: Cluster, release: Release) -> Target:
        settings = cluster.settings
        gpu = gpu_plan.resolve(settings, release, cluster.nodes)
        nodes: list[NodeTarget] = []
        unknown: list[str] = []
        for node in cluster.cluster_nodes:
            # The DOCA driver goes where the Network Operator drives ports.
            rdma = any(nic.kind for nic in node.settings.nics)
            resolved = gpu.nodes.get(node.name)
            os_id = node.settings.os or (settings.node_os.id if settings.node_os else None)
            if os_id is None:
                if resolved is not None or rdma:
                    unknown.append(node.name)
                continue
            key, _, tag = release.os_for(os_id)
            kernels = (node.settings.kernel,) if node.settings.kernel else tuple(
                settings.node_os.kernels if settings.node_os else ())
            nodes.append(NodeTarget(key, tag, kernels, tuple(settings.node_os.architectures) if settings.node_os
                                    else ("amd64",), resolved.driver if resolved else None, rdma,
                                    settings.drivers.precompiled, settings.network_operator.driver == "container"))
        if unknown:
            raise MirrorError(
                f"{cluster.inventory}: the OS of {', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''} is not "
                "known, so the GPU/DOCA driver images (tagged per OS and kernel at run time) cannot be listed",
                hint="add gpuboot.node_os: {id: ubuntu-22.04, kernels: [<uname -r of the GPU nodes>]}, "
                     "or gpuboot_node.os and .kernel per node")
        optional = (("kai_scheduler",) if settings.kai_scheduler.enabled else ()) + (
            ("vcluster",) if any(t.vcluster.enabled for t in settings.tenants) else ()) + (
            ("kube_vip",) if settings.control_plane.mode == "kube_vip" else ())
        return cls(tuple(dict.fromkeys(nodes)), gpu.operands(), nic_plan.resolve(settings, cluster.nodes, release).operands(),
                   optional)


def _lookup(release: Release, dotted: str) -> str:
    data = release.model_dump()
    value: object = data
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise MirrorError(f"release {release.name}: runtime image placeholder {{{dotted}}} is not in the matrix",
                              hint=f"add {dotted} to mirror/releases/{release.name}.yml")
        value = value[part]
    return str(value)


def _fill(template: str, release: Release, values: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        key = match.group(1)
        return values[key] if key in values else _lookup(release, key)
    return PLACEHOLDER.sub(one, template)


def _runtime_images(plan: Plan, release: Release, target: Target) -> None:
    for node in target.nodes:
        for entry in release.runtime_images:
            if not all(node.holds(c) for c in entry.when):
                continue
            axes = {"kernel": node.kernels, "arch": node.architectures}
            for combo in itertools.product(*(axes[a] for a in entry.per)):
                values = {"os_tag": node.os_tag, **dict(zip(entry.per, combo, strict=True))}
                text = _fill(entry.image, release, values)
                detail = ", ".join(f"{k} {v}" for k, v in values.items())
                plan.add_image(parse_image(text), entry.component, f"resolved at run time ({detail})")
        if node.gpu_driver == "preinstalled":
            note = (f"GPU workers on {node.os_key} use the driver installed on the host "
                    "(nvidia.com/gpu.deploy.driver=false): the mirror holds no driver image for them")
            if note not in plan.notes:
                plan.notes.append(note)


def _packages(plan: Plan, release: Release, target: Target) -> None:
    for os_id in target.os_keys:
        pkgs = release.os[os_id]
        kube = pkgs.kube_packages
        containerd = pkgs.containerd
        plan.packages.append(PlannedPackage(os_id, str(containerd["package"]), str(containerd["version"]),
                                            "container runtime"))
        for name in ("kubeadm", "kubelet", "kubectl"):
            plan.packages.append(PlannedPackage(os_id, name, kube.version, "Kubernetes"))
        extra = kube.model_extra or {}
        for key, name in (("cri_tools", "cri-tools"), ("kubernetes_cni", "kubernetes-cni")):
            if key in extra:
                plan.packages.append(PlannedPackage(os_id, name, str(extra[key]), "kubeadm dependency"))
        # The driver container builds its modules against the running kernel's headers.
        kernels = dict.fromkeys(k for n in target.nodes if n.os_key == os_id and n.gpu_driver == "container"
                                for k in n.kernels)
        for kernel in kernels:
            plan.packages.append(PlannedPackage(os_id, pkgs.kernel_headers.format(kernel=kernel), "",
                                                "GPU driver build (headers for the running kernel)"))


def build(release: Release, target: Target | None = None) -> Plan:
    """Expand the release for a target. Without one, only what every cluster needs."""
    target = target or Target()
    plan = Plan(release.name)
    if not release.images:
        raise MirrorError(f"release {release.name} lists no images",
                          hint=f"add an images: section to mirror/releases/{release.name}.yml")
    left_out = release.optional_components - set(target.optional)
    for component, refs in release.images.items():
        if component in left_out:
            continue
        if isinstance(refs, dict):
            # Keyed by operand: only those the cluster's values turn on.
            wanted = {"gpu_operator": target.gpu_operands,
                      "network_operator": target.network_operands}.get(component)
            refs = [ref for operand, ref in refs.items() if wanted is None or operand in wanted]
        for text in refs:
            plan.add_image(parse_image(text), component, "chart default" if component != "kubernetes"
                           else "kubeadm config images list")
    _runtime_images(plan, release, target)
    for component, body in (release.model_extra or {}).items():
        if not isinstance(body, dict) or component in left_out:
            continue
        # A component may ship its CRDs as a chart of their own (Calico from v3.32).
        for chart in (body.get(key) for key in CHART_KEYS):
            if chart:
                plan.charts.append(PlannedChart(component, chart["repository"], chart["name"],
                                                str(chart["version"]), chart.get("digest")))
    _packages(plan, release, target)
    return plan
