"""The complete artifact list of a release for one inventory: every image (the charts'
defaults plus what the operators resolve per OS, kernel and architecture at run time),
every chart and every OS package. Complete by construction: a runtime image whose inputs
are unknown is an error, never a silent omission."""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from gpuboot.config.model import Cluster
from gpuboot.errors import MirrorError
from gpuboot.matrix import Release
from gpuboot.mirror.refs import ImageRef, parse_image

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
class Target:
    """What the plan is expanded for: the nodes' OS, kernels, architectures and features."""

    os_ids: tuple[str, ...]
    kernels: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ("amd64",)
    gpu_workers: bool = True
    rdma: bool = True
    precompiled: bool = False

    @classmethod
    def of(cls, cluster: Cluster) -> Target:
        settings = cluster.settings
        gpu = bool(cluster.in_group("gpu_workers"))
        rdma = any(node.settings.nics for node in cluster.nodes)
        if settings.node_os is None:
            if gpu or rdma:
                raise MirrorError(
                    f"{cluster.inventory}: gpuboot.node_os is not set, so the GPU/DOCA driver images "
                    "(tagged per OS and kernel at run time) cannot be listed",
                    hint="add gpuboot.node_os: {id: ubuntu-22.04, kernels: [<uname -r of the GPU nodes>]}")
            # Without the OS no package can be planned; images need no OS here.
            return cls(os_ids=(), gpu_workers=False, rdma=False)
        return cls(os_ids=(settings.node_os.id,), kernels=tuple(settings.node_os.kernels),
                   architectures=tuple(settings.node_os.architectures), gpu_workers=gpu, rdma=rdma,
                   precompiled=settings.drivers.precompiled)


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
    for os_id in target.os_ids:
        os_pkgs = release.os[os_id]
        conditions = {"gpu_driver_container": target.gpu_workers and os_pkgs.gpu_driver_container,
                      "precompiled": target.precompiled, "rdma": target.rdma}
        for entry in release.runtime_images:
            if not all(conditions[c] for c in entry.when):
                continue
            axes = {"kernel": target.kernels, "arch": target.architectures}
            for combo in itertools.product(*(axes[a] for a in entry.per)):
                values = {"os_tag": os_pkgs.image_os_tag, **dict(zip(entry.per, combo, strict=True))}
                text = _fill(entry.image, release, values)
                detail = ", ".join(f"{k} {v}" for k, v in values.items())
                plan.add_image(parse_image(text), entry.component, f"resolved at run time ({detail})")
        if target.gpu_workers and not os_pkgs.gpu_driver_container:
            plan.notes.append(f"{os_id} has no GPU Operator driver container: GPU workers need a "
                              "host-installed driver (driver.enabled=false)")


def _packages(plan: Plan, release: Release, target: Target) -> None:
    for os_id in target.os_ids:
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
        if target.gpu_workers:
            for kernel in target.kernels:
                plan.packages.append(PlannedPackage(os_id, pkgs.kernel_headers.format(kernel=kernel), "",
                                                    "GPU driver build (headers for the running kernel)"))


def build(release: Release, target: Target | None = None) -> Plan:
    """Expand the release for a target. Without one, only what every cluster needs."""
    target = target or Target(os_ids=(), gpu_workers=False, rdma=False)
    plan = Plan(release.name)
    if not release.images:
        raise MirrorError(f"release {release.name} lists no images",
                          hint=f"add an images: section to mirror/releases/{release.name}.yml")
    for component, refs in release.images.items():
        for text in refs:
            plan.add_image(parse_image(text), component, "chart default" if component != "kubernetes"
                           else "kubeadm config images list")
    _runtime_images(plan, release, target)
    for component, body in (release.model_extra or {}).items():
        chart = body.get("chart") if isinstance(body, dict) else None
        if chart:
            plan.charts.append(PlannedChart(component, chart["repository"], chart["name"],
                                            str(chart["version"]), chart.get("digest")))
    _packages(plan, release, target)
    return plan
