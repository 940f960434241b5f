"""What each GPU node gets from the GPU Operator, resolved once from the inventory, the
release and the GPU table: its driver kind, OS and kernels, its MIG layout and time-slicing
profile, the node labels that pick them, and the resources it must then advertise.

Validation reports every misfit here with its place in the inventory; the values, the
ConfigMaps, the mirror plan and the validation gate all read the same resolution."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from gpuboot import gpus
from gpuboot.config.model import NODE_GROUP_LABEL_PREFIX, GpubootSettings, Node
from gpuboot.errors import MatrixError
from gpuboot.matrix import Release

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
DEVICE_PLUGIN_LABEL = "nvidia.com/device-plugin.config"
DEPLOY_DRIVER_LABEL = "nvidia.com/gpu.deploy.driver"
# gpuboot's own label: which NVIDIADriver object serves the node when kinds or OS releases are mixed.
DRIVER_KIND_LABEL = "gpuboot.io/gpu-driver"
DEFAULT_DEVICE_PLUGIN_CONFIG = "default"
MIG_DISABLED = "all-disabled"


@dataclass(frozen=True)
class Misfit:
    """One problem of one node, with the path under its gpuboot_node where it lies."""

    node: str
    path: tuple
    message: str
    fix: str


@dataclass(frozen=True)
class NodeGpu:
    node: str
    model: gpus.GpuModel | None
    count: int | None
    driver: str                      # container | precompiled | preinstalled
    os_key: str | None
    os_tag: str | None
    kernels: tuple[str, ...]
    mig_config: str | None           # the mig-parted configuration the node's label names
    mig_layout: tuple[tuple[tuple[int, ...] | str, tuple[tuple[str, int], ...]], ...] = ()
    time_slicing_replicas: int = 1
    # The tenants' node groups this node is in: each is a node label tenants' pods select.
    node_groups: tuple[str, ...] = ()

    @property
    def device_plugin_config(self) -> str:
        return f"time-sliced-{self.time_slicing_replicas}" if self.time_slicing_replicas > 1 else DEFAULT_DEVICE_PLUGIN_CONFIG

    def labels(self, mixed_drivers: bool) -> dict[str, str]:
        labels = {DEVICE_PLUGIN_LABEL: self.device_plugin_config}
        labels.update({NODE_GROUP_LABEL_PREFIX + group: "true" for group in self.node_groups})
        if self.mig_config:
            labels[MIG_CONFIG_LABEL] = self.mig_config
        if self.driver == "preinstalled":
            labels[DEPLOY_DRIVER_LABEL] = "false"
        elif mixed_drivers:
            labels[DRIVER_KIND_LABEL] = self.driver
        return labels

    def operand_apps(self) -> list[str]:
        """The GPU Operator's operand pods (their `app` label, as the operator names its
        DaemonSets) that must run Ready on this node: the driver unless it is preinstalled, the
        MIG manager where gpuboot asks for a MIG configuration."""
        apps = ["nvidia-container-toolkit-daemonset", "nvidia-device-plugin-daemonset", "gpu-feature-discovery",
                "nvidia-dcgm-exporter", "nvidia-operator-validator"]
        if self.driver != "preinstalled":
            apps.insert(0, "nvidia-driver-daemonset")
        if self.mig_config:
            apps.append("nvidia-mig-manager")
        return apps

    def gfd_labels(self) -> dict[str, str]:
        """What GPU Feature Discovery must label the node with, as far as the inventory says: the
        family of a declared model; for whole GPUs (MIG changes what GFD names and counts) the
        count, and the product where the GPU table knows GFD's name for it. Time-sliced GPUs are
        named with -SHARED (gpuboot leaves renameByDefault off)."""
        if self.model is None:
            return {}
        found = {"nvidia.com/gpu.family": self.model.gfd_family}
        if any(instances for _, instances in self.mig_layout):
            return found
        if self.model.gfd_product:
            found["nvidia.com/gpu.product"] = self.model.gfd_product + ("-SHARED" if self.time_slicing_replicas > 1 else "")
        if self.count is not None:
            found["nvidia.com/gpu.count"] = str(self.count)
        return found

    def per_gpu(self) -> dict[str, int] | None:
        """What each GPU of a node whose count is not declared advertises, for validation to
        multiply by the count preflight's discovery finds: whole GPUs, time-sliced into their
        replicas. None under a MIG layout (the layout needs the count) or with a declared count."""
        if self.count is not None or self.mig_layout:
            return None
        return {"nvidia.com/gpu": self.time_slicing_replicas}

    def resources(self, strategy: str) -> dict[str, int] | None:
        """What the node must advertise once the operator is done; None when the GPU count
        is not declared (validation then takes preflight's count, with per_gpu)."""
        if self.count is None:
            return None
        if not self.mig_layout:
            return {"nvidia.com/gpu": self.count * self.time_slicing_replicas}
        found: dict[str, int] = {}
        for gpus_of, instances in self.mig_layout:
            indexes = range(self.count) if gpus_of == "all" else gpus_of
            for _ in indexes:
                if not instances:
                    found["nvidia.com/gpu"] = found.get("nvidia.com/gpu", 0) + 1
                for profile, count in instances:
                    name = "nvidia.com/gpu" if strategy == "single" else f"nvidia.com/mig-{profile}"
                    found[name] = found.get(name, 0) + count
        return found


@dataclass
class GpuPlan:
    strategy: str
    nodes: dict[str, NodeGpu] = field(default_factory=dict)
    # mig-parted configurations by name, each a list of device entries.
    mig_configs: dict[str, list[dict]] = field(default_factory=dict)
    misfits: list[Misfit] = field(default_factory=list)

    def offered(self, names: set[str] | None = None) -> dict[str, int] | None:
        """The GPU resources all GPU workers (or those named) advertise together, by resource
        name; None when one of them does not declare its count."""
        total: dict[str, int] = {}
        for node in (n for name, n in self.nodes.items() if names is None or name in names):
            found = node.resources(self.strategy)
            if found is None:
                return None
            for name, count in found.items():
                total[name] = total.get(name, 0) + count
        return total

    @property
    def driver_kinds(self) -> list[str]:
        return sorted({n.driver for n in self.nodes.values() if n.driver != "preinstalled"})

    @property
    def mixed_drivers(self) -> bool:
        """Whether the driver takes NVIDIADriver objects (one per kind) instead of the
        ClusterPolicy: the nodes whose driver the operator deploys differ in kind, or in OS.
        The ClusterPolicy's driver takes the OS tag of the first GPU node the operator lists
        for every node (operator v26.7.0, controllers/state_manager.go: getGPUNodeOSInfo), so
        on a fleet of two OS releases some nodes would pull an image built for the other;
        an NVIDIADriver pools its nodes by OS and kernel."""
        managed = [n for n in self.nodes.values() if n.driver != "preinstalled"]
        return len(self.driver_kinds) > 1 or len({n.os_tag for n in managed}) > 1

    def operands(self) -> tuple[str, ...]:
        """The GPU Operator's operands the values turn on (keys of the matrix's gpu_operator
        images); none without GPU workers."""
        if not self.nodes:
            return ()
        # smokeTest: the image of validate's nvidia-smi Job, one per GPU node group.
        found = ["operator", "validator", "toolkit", "devicePlugin", "dcgmExporter", "nfd", "smokeTest"]
        if self.driver_kinds:
            found.append("driverManager")
        # The MIG manager runs only on MIG-capable GPUs; an undeclared model may be one.
        if any(n.model is None or n.model.mig is not None for n in self.nodes.values()):
            found.append("migManager")
        return tuple(found)

    @property
    def time_slicing(self) -> list[int]:
        return sorted({n.time_slicing_replicas for n in self.nodes.values() if n.time_slicing_replicas > 1})

    def device_plugin_configs(self) -> dict[str, dict]:
        """The device plugin's ConfigMap: one profile per time-slicing replica count in use."""
        flags = {"migStrategy": self.strategy if self.mig_configs.keys() - {MIG_DISABLED} else "none"}
        configs = {DEFAULT_DEVICE_PLUGIN_CONFIG: {"version": "v1", "flags": flags}}
        for replicas in self.time_slicing:
            configs[f"time-sliced-{replicas}"] = {
                "version": "v1", "flags": flags,
                "sharing": {"timeSlicing": {"renameByDefault": False, "failRequestsGreaterThanOne": True,
                                            "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}
        return configs

    def mig_parted(self) -> dict:
        return {"version": "v1", "mig-configs": {name: entries for name, entries in sorted(self.mig_configs.items())}}

    def as_data(self) -> dict:
        """The resolution as Ansible reads it (extra variable gpuboot_gpu)."""
        return {
            "mig_strategy": self.strategy,
            "operands": list(self.operands()),
            "driver_kinds": self.driver_kinds,
            "mixed_drivers": self.mixed_drivers,
            "mig": bool(self.mig_configs.keys() - {MIG_DISABLED}),
            "mig_parted": self.mig_parted(),
            "device_plugin": self.device_plugin_configs(),
            "nodes": {name: {"model": n.model.name if n.model else None, "driver": n.driver, "os_tag": n.os_tag,
                             "kernels": list(n.kernels), "labels": n.labels(self.mixed_drivers),
                             "gfd_labels": n.gfd_labels(), "operands": n.operand_apps(),
                             "resources": n.resources(self.strategy), "per_gpu": n.per_gpu()}
                      for name, n in self.nodes.items()},
        }


def _device_filter(model: gpus.GpuModel) -> list[str]:
    # mig-parted names a device by its PCI device id followed by the vendor, e.g. 0x233010DE.
    return [f"{pci}10DE" for pci in model.pci_devices]


def _entries(layout: tuple, model: gpus.GpuModel | None) -> list[dict]:
    entries = []
    for gpus_of, instances in layout:
        entry: dict = {"devices": gpus_of if gpus_of == "all" else list(gpus_of)}
        if model is not None:
            entry["device-filter"] = _device_filter(model)
        entry["mig-enabled"] = bool(instances)
        if instances:
            entry["mig-devices"] = dict(instances)
        entries.append(entry)
    return entries


class _Resolver:
    def __init__(self, settings: GpubootSettings, release: Release) -> None:
        self.settings = settings
        self.release = release
        self.catalog = gpus.catalog()
        self.plan = GpuPlan(settings.gpu_operator.mig_strategy)

    def misfit(self, node: Node, path: tuple, message: str, fix: str) -> None:
        self.plan.misfits.append(Misfit(node.name, path, message, fix))

    def node(self, node: Node) -> None:
        gpu = node.settings.gpu
        model = None
        if gpu is not None and gpu.model is not None:
            model = self.catalog.get(gpu.model)
            if model is None:
                self.misfit(node, ("gpu", "model"), f"GPU model {gpu.model} is not in gpuboot's GPU table",
                            f"use one of: {', '.join(self.catalog)} (or leave model out)")
        os_key, os_tag, packages = self.os(node)
        kernels = (node.settings.kernel,) if node.settings.kernel else tuple(
            self.settings.node_os.kernels if self.settings.node_os else ())
        driver = self.driver(node, packages, os_tag, kernels)
        replicas = gpu.time_slicing_replicas if gpu and gpu.time_slicing_replicas else 1
        layout = self.layout(node, model)
        if layout and any(instances for _, instances in layout) and replicas > 1:
            self.misfit(node, ("gpu", "time_slicing_replicas"),
                        "time-slicing and MIG on one node: the device plugin shares whole GPUs or MIG devices, "
                        "and gpuboot shares none it partitions",
                        "drop time_slicing_replicas, or set mig.layout: all-disabled to share whole GPUs")
        mig_config = None
        if layout:
            mig_config = self.register_layout(node, model, layout)
        elif model is not None and model.mig is not None:
            # A MIG-capable GPU without a layout is kept whole, whatever MIG mode it was left in.
            mig_config = self.register(MIG_DISABLED, [{"devices": "all", "mig-enabled": False}])
        tenant_groups = sorted({t.node_group for t in self.settings.tenants if t.node_group} & set(node.groups))
        self.plan.nodes[node.name] = NodeGpu(node.name, model, gpu.count if gpu else None, driver, os_key, os_tag,
                                             kernels, mig_config, layout, replicas, tuple(tenant_groups))

    def os(self, node: Node):
        os_id = node.settings.os or (self.settings.node_os.id if self.settings.node_os else None)
        if os_id is None:
            return None, None, None
        try:
            key, packages, tag = self.release.os_for(os_id)
        except MatrixError as exc:
            if node.settings.os:  # the cluster-wide one is reported once, at gpuboot.node_os
                self.misfit(node, ("os",), exc.message, exc.hint or "")
            return None, None, None
        return key, tag, packages

    def driver(self, node: Node, packages, os_tag: str | None, kernels: tuple[str, ...]) -> str:
        asked = node.settings.gpu.driver if node.settings.gpu else None
        has_container = packages is None or packages.gpu_driver_container
        if asked is None:
            if not has_container:
                return "preinstalled"
            kind = "precompiled" if self.settings.drivers.precompiled else "container"
        else:
            kind = asked
        where = ("gpu", "driver") if asked else ("kernel",)
        if kind != "preinstalled" and not has_container:
            self.misfit(node, where, f"the GPU Operator has no driver container for {os_tag}",
                        "install the driver on the host and set gpu.driver: preinstalled")
        if kind == "precompiled" and os_tag is not None:
            published = self.release.precompiled_kernels(os_tag)
            if not kernels:
                self.misfit(node, where, "precompiled drivers are built per kernel, and this node's kernel is not known",
                            "set gpuboot_node.kernel (or gpuboot.node_os.kernels) to what `uname -r` prints on the node")
            for kernel in kernels:
                if kernel not in published:
                    self.misfit(node, ("kernel",) if node.settings.kernel else where,
                                f"no precompiled driver {self.release.name} knows is published for kernel {kernel} "
                                f"on {os_tag} (known: {', '.join(published) or 'none'})",
                                "run one of those kernels, or use gpu.driver: container (built on the node)")
        return kind

    def layout(self, node: Node, model: gpus.GpuModel | None) -> tuple:
        """The node's MIG layout as (gpus, ((profile, count), ...)) per device entry."""
        gpu = node.settings.gpu
        if gpu is None or gpu.mig is None:
            return ()
        mig = gpu.mig
        if model is None:
            if gpu.model is None:
                self.misfit(node, ("gpu", "mig"), "a MIG layout needs the GPU model to be checked against",
                            "set gpu.model (e.g. H100-SXM5-80GB)")
            return ()
        geometry = model.mig
        if geometry is None:
            if mig.layout != MIG_DISABLED:
                self.misfit(node, ("gpu", "mig"), f"{model.name} has no MIG",
                            "remove mig, and share the GPUs with time_slicing_replicas if needed")
            return ()
        if mig.layout is not None:
            devices = self.named_layout(node, mig.layout, geometry)
            if devices is None:
                return ()
        else:
            devices = [(d.gpus, d.instances) for d in mig.devices]
        return self.checked(node, devices, geometry, gpu.count)

    def named_layout(self, node: Node, name: str, geometry: gpus.MigGeometry):
        if name == MIG_DISABLED:
            return [("all", {})]
        if name == "all-balanced":
            return [("all", geometry.balanced)]
        if name in self.settings.gpu_operator.mig_layouts:
            return [(d.gpus, d.instances) for d in self.settings.gpu_operator.mig_layouts[name]]
        profile = name[len("all-"):] if name.startswith("all-") else None
        if profile in geometry.profiles:
            return [("all", {profile: geometry.profiles[profile].most})]
        own = ", ".join(self.settings.gpu_operator.mig_layouts) or "none"
        self.misfit(node, ("gpu", "mig", "layout"), f"MIG layout {name} does not exist for this GPU",
                    f"use all-disabled, all-balanced, one of {', '.join('all-' + p for p in geometry.profiles)}, "
                    f"or a layout of gpuboot.gpu_operator.mig_layouts (have: {own})")
        return None

    def checked(self, node: Node, devices: list, geometry: gpus.MigGeometry, count: int | None) -> tuple:
        seen: dict[int, int] = {}
        ok = True
        for index, (gpus_of, instances) in enumerate(devices):
            path = ("gpu", "mig", "devices", index)
            reason = geometry.misfit(dict(instances))
            if reason:
                ok = False
                self.misfit(node, (*path, "instances"), reason, "choose instances that fit one GPU (see mirror/gpus.yml)")
            if gpus_of == "all":
                if len(devices) > 1:
                    ok = False
                    self.misfit(node, (*path, "gpus"), "`all` GPUs beside other entries",
                                "list the GPU indexes of each entry")
                continue
            for gpu_index in gpus_of:
                if gpu_index in seen:
                    ok = False
                    self.misfit(node, (*path, "gpus"), f"GPU {gpu_index} is also in entry {seen[gpu_index]}",
                                "list each GPU in one entry")
                seen.setdefault(gpu_index, index)
                if count is not None and gpu_index >= count:
                    ok = False
                    self.misfit(node, (*path, "gpus"), f"GPU {gpu_index} does not exist: the node has {count} "
                                f"(0 to {count - 1})", "fix the index or gpu.count")
        if count is not None and seen and len(seen) != count:
            missing = sorted(set(range(count)) - set(seen))
            ok = False
            self.misfit(node, ("gpu", "mig", "devices"), f"GPU {', '.join(map(str, missing))} of {count} is in no entry",
                        "give every GPU an entry (instances: {} keeps it whole)")
        if self.plan.strategy == "single":
            kinds = {tuple(sorted(instances.items())) for _, instances in devices}
            if len(kinds) > 1 or any(not instances for _, instances in devices):
                ok = False
                self.misfit(node, ("gpu", "mig"), "mig_strategy single needs every GPU of a MIG node in one "
                            "profile (its devices are all advertised as nvidia.com/gpu)",
                            "use one profile on all GPUs, or gpuboot.gpu_operator.mig_strategy: mixed")
        if not ok:
            return ()
        return tuple((g if g == "all" else tuple(g), tuple(sorted(i.items()))) for g, i in devices)

    def register_layout(self, node: Node, model: gpus.GpuModel | None, layout: tuple) -> str:
        name = node.settings.gpu.mig.layout if node.settings.gpu and node.settings.gpu.mig else None
        entries = _entries(layout, model)
        if name is None:
            digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:10]
            name = f"gpuboot-{digest}"
        return self.register(name, entries)

    def register(self, name: str, entries: list[dict]) -> str:
        known = self.plan.mig_configs.setdefault(name, [])
        for entry in entries:
            if entry not in known:
                known.append(entry)
        return name


def resolve(settings: GpubootSettings, release: Release, nodes: list[Node] | tuple[Node, ...]) -> GpuPlan:
    resolver = _Resolver(settings, release)
    for node in nodes:
        if "gpu_workers" in node.groups:
            resolver.node(node)
    return resolver.plan

