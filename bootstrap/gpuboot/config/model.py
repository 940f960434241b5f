"""The typed model of a gpuboot cluster: the `gpuboot` variable and per-node settings.

This model is the one owner of every default: each run hands Ansible the validated
settings as data (`gpuboot_settings`, `gpuboot_nodes`), never a second copy of defaults.
"""
from __future__ import annotations

import re
from ipaddress import IPv4Address, IPv4Network
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from gpuboot import matrix

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# Kubernetes extended resource name, e.g. nvidia.com/rdma_shared_a or rdma/cx7.
RESOURCE_NAME = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
PCI_ADDRESS = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"
VENDOR_DEVICE = r"^[0-9a-f]{4}:[0-9a-f]{4}$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
HOST_PORT = r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$"

# Every free-form string that reaches a config file, a manifest or a command line has a
# form: a newline, a quote, a brace or a shell character in one is refused at validation
# (they would inject into keepalived.conf, kubeadm's YAML or a template), not escaped later.
DNS_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$"
# A DNS name (an FQDN may end in a dot) or an IPv4 address; at most 253 characters.
HOST_NAME = r"^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*\.?$"
IFNAME = r"^[A-Za-z0-9_.-]{1,15}$"
UNIX_USER = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"
URL = r"^(https?|ssh)://[^\s\"'\\{}<>`$]+$"
HTTP_URL = r"^https?://[^\s\"'\\{}<>`$]+$"
GIT_URL = r"^((https?|ssh)://[^\s\"'\\{}<>`$]+|[A-Za-z0-9_.-]+@[A-Za-z0-9.-]+:[^\s\"'\\{}<>`$]+)$"
GIT_REF = r"^[A-Za-z0-9][A-Za-z0-9_/-]*(\.[A-Za-z0-9_/-]+)*$"
REPO_PATH = r"^[A-Za-z0-9_][A-Za-z0-9_/-]*(\.[A-Za-z0-9_/-]+)*$"
KERNEL_RELEASE = r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,63}$"
RELEASE_NAME = r"^[a-z0-9][-a-z0-9.]{0,62}$"
PLAIN_PATH = r"^[^\x00-\x1f\x7f]+$"
COMMAND = r"^[^\s\"'\\{}`$;|&<>]+$"
HOST_PATTERN = r"^[^\s\"'\\{}`$;|<>]+$"
GROUP_NAME = r"^[^\x00-\x1f\x7f\"'\\{}`$]{1,253}$"
# What each form is, in an operator's words (validation errors say this, not the expression).
FORMS = {
    DNS_LABEL: "a DNS label: lowercase letters, digits and '-', at most 63",
    DNS_NAME: "a lowercase DNS name (labels of letters, digits and '-', joined by dots)",
    HOST_NAME: "a host name or an IPv4 address",
    HOST_PORT: "host or host:port",
    IFNAME: "a Linux interface name: at most 15 letters, digits, '_', '.' or '-'",
    UNIX_USER: "a login name: a letter or '_', then letters, digits, '_', '.' or '-'",
    URL: "an http(s):// or ssh:// URL without spaces, quotes, braces or '$'",
    GIT_URL: "a Git URL (https://, ssh:// or user@host:path) without spaces, quotes, braces or '$'",
    GIT_REF: "a branch name: letters, digits, '.', '_', '/' or '-', no '..'",
    REPO_PATH: "a relative path in the repository: letters, digits, '.', '_', '/' or '-', no '..'",
    KERNEL_RELEASE: "a kernel release as `uname -r` prints it",
    RELEASE_NAME: "a release name of the version matrix, e.g. k8s-1.36",
    PLAIN_PATH: "a file path on one line",
    COMMAND: "a command name or path without spaces or shell characters",
    HOST_PATTERN: "an Ansible host pattern without spaces, quotes or shell characters",
    GROUP_NAME: "a group name on one line, without quotes, braces, '$' or backslashes",
    QUANTITY: "a Kubernetes quantity such as 64, 500m or 256Gi",
    PCI_ADDRESS: "a PCI address such as 0000:18:00.0",
    VENDOR_DEVICE: "a PCI vendor:device pair in lowercase hex, e.g. 15b3:1021 (ConnectX-7)",
    RESOURCE_NAME: "a Kubernetes extended resource name such as nvidia.com/rdma_a",
}

DnsLabel = Annotated[str, Field(pattern=DNS_LABEL)]
Quantity = Annotated[str, Field(pattern=QUANTITY)]
FilePath = Annotated[str, Field(min_length=1, pattern=PLAIN_PATH)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ControlPlaneEndpoint(Strict):
    vip: IPv4Address
    mode: Literal["keepalived_haproxy", "kube_vip", "external"] = "keepalived_haproxy"
    # The port each API server listens on (kubeadm's bindPort).
    apiserver_port: int = Field(6443, ge=1, le=65535)
    # The port clients use on the VIP. With keepalived_haproxy, haproxy runs on the control
    # planes beside the API servers, so it needs a port of its own (kubeadm's HA guide: 8443).
    port: int | None = Field(None, ge=1, le=65535)
    dns_name: Annotated[str, Field(pattern=DNS_NAME, max_length=253)] | None = None
    interface: Annotated[str, Field(pattern=IFNAME)] | None = None
    virtual_router_id: int = Field(51, ge=1, le=255)

    @field_validator("port")
    @classmethod
    def _port_of_its_own(cls, port: int | None, info: ValidationInfo) -> int | None:
        if port is not None and info.data.get("mode") == "keepalived_haproxy" and port == info.data.get("apiserver_port"):
            raise ValueError(
                f"port {port} is also the API servers' port, and haproxy runs beside them on the control "
                f"planes; set control_plane.port to 8443 (clients use VIP:8443) or control_plane.apiserver_port "
                f"to another port")
        if port is not None and info.data.get("mode") == "kube_vip" and port != info.data.get("apiserver_port"):
            raise ValueError(
                f"port {port} is not the API servers' port {info.data.get('apiserver_port')}: kube-vip balances "
                f"nothing, clients reach the VIP holder's own API server; leave control_plane.port out or set it "
                f"to the apiserver_port")
        return port

    @model_validator(mode="before")
    @classmethod
    def _default_port(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("port") is None:
            keepalived = data.get("mode", "keepalived_haproxy") == "keepalived_haproxy"
            data = {**data, "port": 8443 if keepalived else data.get("apiserver_port", 6443)}
        return data


class Calico(Strict):
    # VXLANCrossSubnet: no encapsulation between nodes of one subnet, VXLAN across subnets.
    encapsulation: Literal["VXLANCrossSubnet", "VXLAN", "IPIPCrossSubnet", "IPIP", "None"] = "VXLANCrossSubnet"
    # The pods' MTU; 0 lets Calico detect it from the node's interface.
    mtu: int = Field(0, ge=0, le=9000)
    block_size: int = Field(26, ge=20, le=32)
    # The IP pool; kubeadm's podSubnet (networking.pod_cidr) unless it is a part of it.
    ip_pool_cidr: IPv4Network | None = None
    bgp: bool = False


class Networking(Strict):
    pod_cidr: IPv4Network = IPv4Network("10.244.0.0/16")
    service_cidr: IPv4Network = IPv4Network("10.96.0.0/12")
    dns_domain: Annotated[str, Field(pattern=DNS_NAME, max_length=253)] = "cluster.local"
    # calico: production (tigera-operator). bridge: the CNI reference plugins with a route per
    # node, for clusters on one L2 segment without network policy (the lab).
    cni: Literal["calico", "bridge"] = "calico"
    calico: Calico = Calico()

    @field_validator("pod_cidr", "service_cidr", mode="before")
    @classmethod
    def _network_not_host(cls, value: object) -> object:
        # IPv4Network rejects host bits with a vague message; say what to write instead.
        if isinstance(value, str) and "/" in value:
            try:
                IPv4Network(value)
            except ValueError as exc:
                if "host bits set" in str(exc):
                    fixed = IPv4Network(value, strict=False)
                    raise ValueError(f"{value} has host bits set; did you mean {fixed}?") from None
        return value


class Ssh(Strict):
    user: Annotated[str, Field(pattern=UNIX_USER)] = "root"
    private_key_file: FilePath | None = None
    port: int = Field(22, ge=1, le=65535)
    jump_host: Annotated[str, Field(pattern=HOST_NAME, max_length=253)] | None = None
    host_key_checking: bool = True


class Executor(Strict):
    """An execution node: a machine that runs Ansible for a share of the nodes in the phases
    that touch each node alone (os_prep, container_runtime, kube_packages), reached over SSH
    with `ansible-runner worker` installed (the same ansible-core and ansible-runner as the
    control machine). The control machine streams each share's work to it and reads back one
    stream of events (docs/executors.md)."""

    name: DnsLabel
    address: Annotated[str, Field(pattern=HOST_NAME, max_length=253)]
    # Unset: gpuboot.ssh's user, port and key.
    user: Annotated[str, Field(pattern=UNIX_USER)] | None = None
    port: int | None = Field(None, ge=1, le=65535)
    private_key_file: FilePath | None = None
    # The executor's host key as ssh-keyscan prints it (unset: the operator's known_hosts).
    known_hosts_file: FilePath | None = None
    # ansible-runner on the executor: a command on its PATH or a path.
    runner: Annotated[str, Field(pattern=COMMAND)] = "ansible-runner"
    # Where each share's work is unpacked (then deleted): an absolute path on the executor,
    # short enough for the ssh control sockets below it (a socket's path has 107 bytes).
    work_dir: Annotated[str, Field(pattern=r"^/[^\x00-\x1f\x7f\s]*$", max_length=40)] = "/var/tmp/gpuboot-executor"


class Tools(Strict):
    """Programs gpuboot runs on the control machine (never on a node)."""

    # Renders the add-ons' charts (`helm template`, as Argo CD does): a command on PATH or a path.
    helm: Annotated[str, Field(pattern=COMMAND)] = "helm"


class Mirror(Strict):
    air_gapped: bool = False
    registry: Annotated[str, Field(pattern=HOST_PORT)] | None = None
    ca_file: FilePath | None = None
    credentials_file: FilePath | None = None
    packages_url: Annotated[str, Field(pattern=URL)] | None = None
    # Signing key of the package repository at packages_url (apt signed-by, rpm gpgkey).
    packages_key_file: FilePath | None = None
    # The mirror host's own certificate and key (`gpuboot mirror cert` issues them from the CA).
    tls_cert_file: FilePath | None = None
    tls_key_file: FilePath | None = None
    # A connected site's pull-through caches (mirror.registry set, not air-gapped) fetch from
    # the upstream registries themselves, or from these: {upstream name: URL of the site's own
    # proxy of it}. The names are the release's upstream_registries.
    cache_remotes: dict[str, Annotated[str, Field(pattern=HTTP_URL)]] = {}

    @model_validator(mode="after")
    def _registry_when_air_gapped(self) -> Mirror:
        if self.air_gapped and not self.registry:
            raise ValueError("air_gapped is true but no mirror registry is set; set mirror.registry to HOST:PORT of the mirror")
        if self.cache_remotes and (self.air_gapped or not self.registry):
            raise ValueError("cache_remotes is for a connected site's pull-through caches; "
                             + ("an air-gapped mirror holds every image itself: remove cache_remotes"
                                if self.air_gapped else "set mirror.registry to HOST:PORT of the mirror host"))
        return self


OsId = Annotated[str, Field(pattern=r"^[a-z]+-[0-9]+(\.[0-9]+)?$")]


class NodeOs(Strict):
    """What the nodes run. The GPU and DOCA driver images are chosen per OS, kernel and
    architecture at run time, so the mirror plan needs these to be complete."""

    id: OsId
    # Checked against the release (a kernel string, not older than its min_kernel) in checks.node_os.
    kernels: list[Annotated[str, Field(pattern=KERNEL_RELEASE)]] = []
    architectures: list[Literal["amd64", "arm64"]] = ["amd64"]


class Drivers(Strict):
    # Precompiled GPU/DOCA driver containers (one image per kernel) instead of building
    # the modules on each node at start-up.
    precompiled: bool = False


MigProfile = Annotated[str, Field(pattern=r"^[0-9]+g\.[0-9]+gb(\+me)?$")]
MigInstances = dict[MigProfile, Annotated[int, Field(ge=1, le=7)]]


class MigDevices(Strict):
    """MIG instances on some of a node's GPUs. `instances` empty: MIG off, the GPUs stay whole."""

    # GPU indexes as nvidia-smi numbers them, or every GPU of the node.
    gpus: Literal["all"] | list[Annotated[int, Field(ge=0, le=15)]] = "all"
    instances: MigInstances = {}


class Mig(Strict):
    """A node's MIG layout: a named one, or the instances per GPU."""

    # all-disabled, all-balanced, all-<profile> (e.g. all-1g.10gb), or a name from
    # gpuboot.gpu_operator.mig_layouts.
    layout: Annotated[str, Field(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,62}$")] | None = None
    devices: list[MigDevices] = []

    @model_validator(mode="after")
    def _one_way(self) -> Mig:
        if (self.layout is None) == (not self.devices):
            raise ValueError("mig needs exactly one of layout and devices; give mig.layout (a named layout) "
                             "or mig.devices (instances per GPU)")
        return self


class GpuOperator(Strict):
    # How MIG devices are advertised: mixed (nvidia.com/mig-1g.10gb, ...) or single (every MIG
    # device as nvidia.com/gpu; each MIG node then uses one profile on all its GPUs).
    mig_strategy: Literal["single", "mixed"] = "mixed"
    # Named MIG layouts nodes can pick with gpu.mig.layout, as instances per GPU.
    mig_layouts: dict[Annotated[str, Field(pattern=r"^[a-z0-9][-a-z0-9_.]{0,62}$")], list[MigDevices]] = {}
    # NVIDIA's validator links every NVIDIA device node under /dev/char, which containerd's
    # systemd cgroup driver needs (gpu-operator #430). It needs the driver's device majors in
    # /proc/devices; turn it off only where the host cannot have them, as NVIDIA documents.
    dev_char_symlinks: bool = True
    # The driver upgrade (NVIDIA's upgrade controller, on a release's driver change): GPU nodes
    # whose driver it changes at once, and how many GPU nodes may be unavailable meanwhile.
    upgrade_max_parallel: int = Field(1, ge=1, le=64)
    upgrade_max_unavailable: Annotated[str, Field(pattern=r"^(100|[1-9]?[0-9])%$|^[1-9][0-9]{0,3}$")] = "25%"


class NetworkOperator(Strict):
    # container: the operator runs NVIDIA's DOCA driver container on every fabric node (built on
    # the node, or precompiled with gpuboot.drivers.precompiled); host: the nodes' own mlx5
    # driver serves (the kernel's, or DOCA-Host installed with the OS), and no driver container
    # runs. NVIDIA publishes the container for some OSes only (the release's doca_driver_container).
    driver: Literal["container", "host"] = "container"
    # DOCA driver containers the operator replaces at once on a driver change.
    upgrade_max_parallel: int = Field(1, ge=1, le=64)
    # Nodes the SR-IOV operator may drain at once for a VF change (SriovNetworkPoolConfig).
    sriov_max_unavailable: int = Field(1, ge=1, le=1000)


class GitOps(Strict):
    repo_url: Annotated[str, Field(pattern=GIT_URL)]
    branch: Annotated[str, Field(pattern=GIT_REF, max_length=100)] = "main"
    # The cluster's directory in the repository; unset: clusters/<cluster_name>, so clusters
    # sharing a repository never write over each other.
    path: Annotated[str, Field(pattern=REPO_PATH, max_length=200)] | None = None
    # The deploy key (an SSH private key with write access to the repository) and the Git
    # server's host key as ssh-keyscan prints it: the handoff pushes with host-key checking on.
    credentials_file: FilePath | None = None
    known_hosts_file: FilePath | None = None

    def directory(self, cluster_name: str) -> str:
        return self.path or f"clusters/{cluster_name}"


class TenantQuota(Strict):
    # nvidia.com/gpu the tenant's pods may request together (0: none). With time-slicing a
    # quota counts replicas, not physical GPUs.
    gpu: int = Field(0, ge=0)
    # MIG devices by profile (mig_strategy mixed), e.g. {"1g.10gb": 14}; a profile the
    # cluster offers and the tenant does not name: none.
    mig: dict[MigProfile, Annotated[int, Field(ge=1)]] = {}
    # Unset: not limited.
    cpu: Quantity | None = None
    memory: Quantity | None = None
    pods: int | None = Field(None, ge=1)


class TenantDefaults(Strict):
    """What a container that asks for nothing requests (a LimitRange), so it counts against the quota."""

    cpu: Quantity = "100m"
    memory: Quantity = "256Mi"


class TenantVCluster(Strict):
    """A virtual control plane of the tenant's own (vCluster, Kubernetes distro) in its namespace,
    installed by Argo CD from the GitOps repository. The pods it syncs run in the namespace, under
    the tenant's quota, limits, network policies and lowest priority tier."""

    enabled: bool = False
    # Its state lives on a PersistentVolumeClaim: the cluster needs a StorageClass (unset: the
    # default one). gpuboot installs none.
    storage_class: Annotated[str, Field(pattern=DNS_NAME, max_length=253)] | None = None
    storage_size: Quantity = "5Gi"


GroupName = Annotated[str, Field(pattern=GROUP_NAME)]
# The cluster's priority tiers, highest first (P0-P3); a tenant names those its pods may use.
PRIORITY_TIERS = ("serving", "training", "interactive", "batch")
PriorityTier = Literal["serving", "training", "interactive", "batch"]


# The node label that puts a GPU node in a tenant's node group: node-group.gpuboot.io/<group>=true.
NODE_GROUP_LABEL_PREFIX = "node-group.gpuboot.io/"


class Tenant(Strict):
    name: DnsLabel
    quota: TenantQuota = TenantQuota()
    # Identity-provider groups: `groups` may edit the namespace's workloads, `admin_groups` may
    # also grant access within it, `view_groups` may read it. None may change its quota,
    # limits or network policies (Argo CD puts them back).
    groups: list[GroupName] = []
    admin_groups: list[GroupName] = []
    view_groups: list[GroupName] = []
    priority_classes: list[PriorityTier] = ["batch"]
    # Pod Security Admission level enforced on the namespace (restricted is always warned).
    pod_security: Literal["privileged", "baseline", "restricted"] = "baseline"
    defaults: TenantDefaults = TenantDefaults()
    # With gpuboot.kai_scheduler: how much of what is left over the queues' quotas this
    # tenant's queue gets, relative to the others' (0: nothing beyond its quota).
    over_quota_weight: int = Field(1, ge=0)
    vcluster: TenantVCluster = TenantVCluster()
    # The inventory group whose GPU nodes run the tenant's pods (e.g. the time-sliced L4
    # workers): its namespace admits only pods that select that group (NODE_GROUP_LABEL_PREFIX),
    # and its quota must fit what that group's nodes advertise. None: any GPU node.
    node_group: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")] | None = None

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        if isinstance(data, dict) and "priority_class" in data:
            raise ValueError("priority_class was replaced by priority_classes, the cluster's tiers the tenant's "
                             "pods may use; write priority_classes: a list of serving, training, interactive, batch "
                             "(e.g. [training, batch])")
        return data

    @field_validator("priority_classes")
    @classmethod
    def _some_tier(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("no tier named; name at least one of serving, training, interactive, batch")
        if len(set(value)) != len(value):
            raise ValueError("a tier is named twice; name each once")
        return value


class KaiScheduler(Strict):
    """NVIDIA's KAI scheduler for the tenants' GPU work: installed by Argo CD from the GitOps
    repository (gpuboot renders its Application and values; `up` never installs it), with one
    queue per tenant derived from the tenant's quota (gpuboot/gitops/queues.py)."""

    enabled: bool = False
    # The queue every tenant's queue hangs under.
    parent_queue: DnsLabel = "gpuboot-tenants"


class GpubootSettings(Strict):
    cluster_name: DnsLabel
    release: Annotated[str, Field(pattern=RELEASE_NAME)]
    control_plane: ControlPlaneEndpoint
    networking: Networking = Networking()
    ssh: Ssh = Ssh()
    mirror: Mirror = Mirror()
    tools: Tools = Tools()
    node_os: NodeOs | None = None
    drivers: Drivers = Drivers()
    gpu_operator: GpuOperator = GpuOperator()
    network_operator: NetworkOperator = NetworkOperator()
    gitops: GitOps | None = None
    tenants: list[Tenant] = []
    kai_scheduler: KaiScheduler = KaiScheduler()
    # Execution nodes for fleets past one control machine: the node-local phases' hosts are
    # split among them (docs/executors.md). Empty: everything runs on the control machine.
    executors: list[Executor] = []
    # Ansible host patterns (hosts or groups) of the inventory that gpuboot leaves alone:
    # monitoring boxes, storage, ... Every other host must be in a gpuboot group.
    ignored_hosts: list[Annotated[str, Field(pattern=HOST_PATTERN)]] = []

    @model_validator(mode="after")
    def _executors_unique(self) -> GpubootSettings:
        names = [e.name for e in self.executors]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"executors: {', '.join(twice)} named more than once; give each executor its own name")
        return self


DriverKind = Literal["container", "precompiled", "preinstalled"]


class GpuSettings(Strict):
    # A model of mirror/gpus.yml (e.g. H100-SXM5-80GB); preflight checks the node really has it.
    model: str | None = None
    # How many GPUs the node must show; preflight fails when one has fallen off the bus.
    count: int | None = Field(None, ge=1, le=16)
    # container: the GPU Operator builds the driver on the node; precompiled: its image per
    # kernel; preinstalled: the host has the driver (DGX OS), the operator deploys none.
    # Unset: gpuboot.drivers.precompiled decides, and preinstalled where the OS has no driver container.
    driver: DriverKind | None = None
    mig: Mig | None = None
    time_slicing_replicas: int | None = Field(None, ge=2, le=64)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        if isinstance(data, dict) and ({"mig_strategy", "mig_profile"} & set(data)):
            raise ValueError("mig_strategy and mig_profile were replaced; write the node's layout as "
                             "gpu.mig.layout (e.g. all-1g.10gb) or gpu.mig.devices, and the strategy once for the "
                             "cluster as gpuboot.gpu_operator.mig_strategy (docs/gpu-stack.md, MIG)")
        return data


class IpPool(Strict):
    """An nv-ipam pool: each node of the NIC group gets a block of per_node_block_size addresses."""

    subnet: IPv4Network
    gateway: IPv4Address | None = None
    per_node_block_size: int = Field(32, ge=2, le=65536)

    @model_validator(mode="after")
    def _gateway_inside(self) -> IpPool:
        if self.gateway is not None and self.gateway not in self.subnet:
            raise ValueError(f"gateway {self.gateway} is outside subnet {self.subnet}; give an address of the "
                             "subnet or leave gateway out")
        return self


class NicNetwork(Strict):
    """The secondary network pods attach to on a NIC group's ports: an SR-IOV network for
    VFs, IPoIB (link_type ib) or macvlan (eth) over the shared ports, addresses from nv-ipam."""

    name: DnsLabel
    namespace: DnsLabel = "default"
    ip_pool: IpPool


NicPurpose = Literal["fabric", "management", "storage"]
NicMode = Literal["rdma_shared", "sriov", "both"]


class Nic(Strict):
    """Ports of one node, one NIC group (its name): what the Network Operator does with them.
    purpose management or storage: ports no operator object may select (the node's own
    traffic, NVMe/NFS over RDMA); they are declared so that gpuboot can prove that."""

    name: DnsLabel
    pf_names: list[Annotated[str, Field(pattern=IFNAME)]] = []
    pci_addresses: list[Annotated[str, Field(pattern=PCI_ADDRESS)]] = []
    # vendor:device (15b3:1021 ConnectX-7, 15b3:101d ConnectX-6 Dx): every such port of the node.
    device_ids: list[Annotated[str, Field(pattern=VENDOR_DEVICE)]] = []
    purpose: NicPurpose = "fabric"
    # rdma_shared: the RDMA shared device plugin hands the ports to pods (rdma_hca_max pods
    # each); sriov: VFs; both: VFs and the shared plugin on the PFs. Unset: sriov with num_vfs.
    mode: NicMode | None = None
    num_vfs: int = Field(0, ge=0, le=256)
    link_type: Literal["eth", "ib"] = "eth"
    # The VF resource (sriov, both) or the shared resource (rdma_shared).
    resource_name: Annotated[str, Field(pattern=RESOURCE_NAME)] | None = None
    # The shared plugin's resource when mode is both.
    shared_resource_name: Annotated[str, Field(pattern=RESOURCE_NAME)] | None = None
    rdma_hca_max: int = Field(63, ge=1, le=1000)
    rdma: bool = True
    device_type: Literal["netdevice", "vfio-pci"] = "netdevice"
    network: NicNetwork | None = None

    @property
    def kind(self) -> NicMode | None:
        """What the operator does with the ports; None for ports it must leave alone."""
        if self.purpose != "fabric":
            return None
        return self.mode or ("sriov" if self.num_vfs else "rdma_shared")

    @property
    def resources(self) -> dict[str, str]:
        """Resource name -> what advertises it (sriov or rdma_shared)."""
        kind = self.kind
        if kind is None or self.resource_name is None:
            return {}
        if kind == "both":
            return {self.resource_name: "sriov", **({self.shared_resource_name: "rdma_shared"}
                                                     if self.shared_resource_name else {})}
        return {self.resource_name: kind}

    @model_validator(mode="after")
    def _consistent(self) -> Nic:
        ways = [k for k in ("pf_names", "pci_addresses", "device_ids") if getattr(self, k)]
        if not ways:
            raise ValueError("a NIC needs pf_names, pci_addresses or device_ids to select its ports; list its PF "
                             "interface names, PCI addresses or vendor:device ids")
        if len(ways) > 1:
            # The operators AND their selectors: names and addresses together select their overlap.
            raise ValueError(f"a NIC selects its ports one way, but {' and '.join(ways)} are both set; keep one "
                             "(the operators would select only ports that match all of them)")
        if self.purpose != "fabric":
            given = [k for k in ("mode", "resource_name", "shared_resource_name", "network")
                     if getattr(self, k) is not None] + (["num_vfs"] if self.num_vfs else [])
            if given:
                raise ValueError(f"{self.purpose} ports are never touched by the Network Operator, but "
                                 f"{', '.join(given)} asks for it; remove {', '.join(given)} or set purpose: fabric")
            return self
        kind = self.kind
        if self.resource_name is None:
            raise ValueError("a fabric NIC needs resource_name, the resource pods request (e.g. "
                             "nvidia.com/cx7_fabric); or set purpose: management/storage for ports left alone")
        if kind in ("sriov", "both") and not self.num_vfs:
            raise ValueError(f"mode {kind} makes VFs, but num_vfs is 0; set num_vfs (1 or more)")
        if kind == "rdma_shared" and self.num_vfs:
            raise ValueError("mode rdma_shared makes no VFs, but num_vfs is set; use mode both for VFs and shared "
                             "ports, or remove num_vfs")
        if kind == "both" and not self.shared_resource_name:
            raise ValueError("mode both advertises two resources; set shared_resource_name for the shared ports "
                             "(resource_name is the VFs')")
        if kind in ("rdma_shared", "both") and self.pci_addresses and not (self.pf_names or self.device_ids):
            raise ValueError("the RDMA shared device plugin selects ports by interface name or vendor:device, not by "
                             "PCI address; list the ports' pf_names (or device_ids)")
        if self.device_type == "vfio-pci" and self.rdma and kind != "rdma_shared":
            raise ValueError("vfio-pci VFs go to user space (DPDK, VMs) and cannot be RDMA netdevices; set "
                             "rdma: false, or device_type: netdevice")
        for name in (self.resource_name, self.shared_resource_name):
            if name is not None and "/" not in name:
                raise ValueError(f"resource {name} has no prefix; write it as a prefixed name pods request, e.g. "
                                 f"nvidia.com/{name}")
        return self


class NodeSettings(Strict):
    gpu: GpuSettings | None = None
    nics: list[Nic] = []
    # What this node runs when it differs from gpuboot.node_os: `<id>-<VERSION_ID>` (the driver
    # image tag of some OSes carries the minor, e.g. rhel-9.6) and `uname -r`.
    os: OsId | None = None
    kernel: Annotated[str, Field(pattern=KERNEL_RELEASE)] | None = None


class Node(BaseModel):
    """A host as gpuboot sees it after reading the inventory."""

    model_config = ConfigDict(frozen=True)
    name: str
    address: str
    port: int
    groups: frozenset[str]
    settings: NodeSettings = NodeSettings()
    file: str
    line: int | None = None

    @property
    def role(self) -> str:
        if "control_plane" in self.groups:
            return "control_plane"
        if "gpu_workers" in self.groups:
            return "gpu_worker"
        if "workers" in self.groups:
            return "worker"
        return next(iter(sorted(self.groups)), "ungrouped")


class Cluster(BaseModel):
    """A validated inventory: settings, nodes, and where it came from."""

    model_config = ConfigDict(frozen=True)
    inventory: str
    settings: GpubootSettings
    nodes: tuple[Node, ...]
    source_files: tuple[str, ...]
    # Ansible's parsed inventory, for host patterns (never serialised).
    _inventory: Any = PrivateAttr(default=None)
    # What resolves the GPU and NIC plans from this model (the loader gives it: the resolvers
    # read the model, so the model does not import them), and its answer, computed once.
    _resolver: Any = PrivateAttr(default=None)
    _plans: Any = PrivateAttr(default=None)

    def attach_inventory(self, inventory: Any) -> None:
        self._inventory = inventory

    def attach_resolver(self, resolver: Any) -> None:
        self._resolver, self._plans = resolver, None

    def at_release(self, release: str) -> Cluster:
        """The same cluster with another release of the matrix (gpuboot upgrade's target)."""
        moved = self.model_copy(update={"settings": self.settings.model_copy(update={"release": release})})
        moved.attach_inventory(self._inventory)
        moved.attach_resolver(self._resolver)
        return moved

    def hosts_matching(self, pattern: str) -> list[str]:
        """Hosts of an Ansible pattern, in inventory order, as ansible-playbook resolves it."""
        if self._inventory is None:
            raise RuntimeError("this Cluster was not loaded from an inventory")
        cluster = {n.name for n in self.nodes}
        return [h for h in self._inventory.hosts_matching(pattern) if h in cluster]

    @property
    def inventory_manager(self) -> Any:
        """Ansible's InventoryManager for this inventory (for Ansible's own variable code)."""
        if self._inventory is None:
            raise RuntimeError("this Cluster was not loaded from an inventory")
        return self._inventory.manager

    @property
    def first_control_plane(self) -> str | None:
        """Where kubeadm init runs and the cluster lock lives."""
        return next(iter(self.hosts_matching("control_plane[0]")), None)

    def host_inputs(self, name: str) -> dict[str, Any]:
        """The host's inventory variables as Ansible merged them (part of a phase's inputs)."""
        if self._inventory is None or name not in self._inventory.hosts:
            return {}
        return dict(self._inventory.hosts[name].vars)

    def extravars(self) -> dict[str, Any]:
        """The validated settings as Ansible reads them: every default filled in by this model.
        File references only: validation refuses inline secrets."""
        from gpuboot import gpus
        from gpuboot.mirror import caches

        release = matrix.entry(self.settings.release)
        mirror = self.settings.mirror
        return {"gpuboot_settings": self.settings.model_dump(mode="json"),
                "gpuboot_nodes": {n.name: n.settings.model_dump(mode="json") for n in self.nodes},
                # The matrix entry as data: read once here, not once per variable lookup per host.
                "gpuboot_release": release,
                # A connected site's pull-through caches on the mirror host (none in an air gap).
                "gpuboot_mirror_caches": [c.as_data() for c in caches.caches(
                    mirror.registry, mirror.air_gapped, release.get("upstream_registries", []), mirror.cache_remotes)],
                # What each GPU node gets from the GPU Operator, resolved once.
                "gpuboot_gpu": self.gpu_plan.as_data(),
                # What the Network Operator does with each node's NICs, resolved once.
                "gpuboot_network": self.nic_plan.as_data(),
                # The GPU table, for preflight to recognise the models on the nodes.
                "gpuboot_gpu_models": gpus.catalog_data()}

    def _resolved(self) -> tuple[Any, Any]:
        if self._plans is None:
            if self._resolver is None:
                raise RuntimeError("this Cluster was not loaded by gpuboot.config.loader: no plan resolver")
            self._plans = self._resolver(self)
        return self._plans

    @property
    def gpu_plan(self):
        """What each GPU node gets from the GPU Operator (gpuboot.gpu_plan.GpuPlan)."""
        return self._resolved()[0]

    @property
    def nic_plan(self):
        """What the Network Operator does with each node's NICs (gpuboot.nic_plan.NicPlan)."""
        return self._resolved()[1]

    def in_group(self, group: str) -> list[Node]:
        return [n for n in self.nodes if group in n.groups]

    @property
    def control_planes(self) -> list[Node]:
        return self.in_group("control_plane")

    @property
    def cluster_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.groups & {"control_plane", "workers"}]


SECRET_KEY = re.compile(r"(password|passwd|secret|token|private_key$|certificate_key|api_key|access_key)", re.I)
