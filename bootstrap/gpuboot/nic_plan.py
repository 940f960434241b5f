"""What the Network Operator does with each node's NICs, resolved once from the inventory.

Nodes declare their NICs per node or per group; NICs of one name on several nodes are one
NIC group, served by one SR-IOV policy and one RDMA shared device plugin resource. Those
objects select ports by the names, addresses or device ids the group's nodes use, on every
node they reach, so the group's settings must agree and a selector must not reach a port
another node declares as management, storage or another group's. Validation reports each
misfit with its place; preflight then checks the same selectors against each node's real
ports (tests/doubles/hardware for the lab). The templates, the mirror plan and the
validation gate read this one resolution."""
from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Network

from gpuboot.config.model import GpubootSettings, Nic, Node
from gpuboot.errors import MatrixError
from gpuboot.gpu_plan import Misfit
from gpuboot.matrix import Release

MELLANOX = "15b3"
# gpuboot's node labels: a NIC group's policy and pool select its nodes by the first; the
# NicClusterPolicy's one node affinity (DOCA driver, shared plugin, Multus) by the second.
GROUP_LABEL = "nic.gpuboot.io/{group}"
FABRIC_LABEL = "nic.gpuboot.io/fabric-node"
# The RDMA shared device plugin's re-scan of devices, seconds.
SHARED_RESCAN_S = 300
# Settings that one policy or one plugin entry holds for the whole group.
GROUP_FIELDS = ("purpose", "kind", "num_vfs", "link_type", "device_type", "rdma", "resource_name",
                "shared_resource_name", "rdma_hca_max", "network")


def _shown(value: object) -> object:
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def _way(nic: Nic) -> str:
    return next(k for k in ("pf_names", "pci_addresses", "device_ids") if getattr(nic, k))


@dataclass
class NicGroup:
    name: str
    nic: Nic                          # the group's settings, as its first node declares them
    first: str                        # that node
    members: dict[str, Nic] = field(default_factory=dict)
    # union() per selector key, kept until a member is added: a 2,000-node group is asked once
    # per node it reaches, and recomputing made validation quadratic.
    _unions: dict[str, list[str]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def kind(self) -> str | None:
        return self.nic.kind

    def add(self, node: str, nic: Nic) -> None:
        self.members[node] = nic
        self._unions.clear()

    def union(self, key: str) -> list[str]:
        """Every value of one selector over the group's nodes: what its objects list."""
        if key not in self._unions:
            self._unions[key] = list(dict.fromkeys(v.lower() if key == "pci_addresses" else v
                                                   for nic in self.members.values() for v in getattr(nic, key)))
        return list(self._unions[key])

    @property
    def label(self) -> str:
        return GROUP_LABEL.format(group=self.name)

    def selector(self, shared: bool = False) -> dict[str, list[str]]:
        found = {key: self.union(key) for key in ("pf_names", "pci_addresses", "device_ids") if self.union(key)}
        if shared:  # the shared plugin's entry also selects by link type
            found["link_types"] = [self.nic.link_type]
        return found


@dataclass
class NicPlan:
    groups: dict[str, NicGroup] = field(default_factory=dict)
    # node -> its NICs in inventory order
    nodes: dict[str, tuple[Nic, ...]] = field(default_factory=dict)
    misfits: list[Misfit] = field(default_factory=list)
    # Nodes with GPUs: an RDMA bandwidth test between two of them moves GPU memory (DMA-BUF).
    gpu_nodes: set[str] = field(default_factory=set)
    # Whether the cluster has gpu_workers, so the GPU Operator and its NFD are installed.
    gpu_operator: bool = False
    # Whether the operator runs the DOCA driver container (gpuboot.network_operator.driver).
    doca_driver: bool = True

    @property
    def fabric(self) -> list[NicGroup]:
        return [g for g in self.groups.values() if g.kind]

    def of_kind(self, *kinds: str) -> list[NicGroup]:
        return [g for g in self.fabric if g.kind in kinds]

    @property
    def fabric_nodes(self) -> list[str]:
        return [n for n, nics in self.nodes.items() if any(nic.kind for nic in nics)]

    @property
    def shared_nodes(self) -> list[str]:
        """Where the RDMA shared device plugin runs: the NicClusterPolicy has one node affinity,
        so every fabric node, with every shared entry, once any group is shared."""
        return self.fabric_nodes if self.of_kind("rdma_shared", "both") else []

    def reach(self, node: str) -> list[tuple[NicGroup, str]]:
        """The (group, object) pairs whose selectors act on the node's ports."""
        found = [(g, "SR-IOV policy") for g in self.of_kind("sriov", "both") if node in g.members]
        if self.of_kind("rdma_shared", "both") and any(nic.kind for nic in self.nodes.get(node, ())):
            found += [(g, "RDMA shared device plugin") for g in self.of_kind("rdma_shared", "both")]
        return found

    @property
    def own_nfd(self) -> bool:
        """Whether the Network Operator's chart brings the cluster's Node Feature Discovery. The
        operator deploys the DOCA driver and the device plugins only on nodes NFD labelled (a
        Mellanox NIC, the OS, the kernel); one NFD serves a cluster, and where the GPU Operator
        is installed (in the phase before) it is that one, as NVIDIA advises."""
        return bool(self.fabric) and not self.gpu_operator

    @property
    def sriov_resource_prefix(self) -> str:
        names = [g.nic.resource_name for g in self.of_kind("sriov", "both")]
        return names[0].split("/", 1)[0] if names else "nvidia.com"

    def operands(self) -> tuple[str, ...]:
        """The images the rendered values and NicClusterPolicy deploy (keys of the matrix's
        network_operator images); none without fabric NICs."""
        if not self.fabric:
            return ()
        found = ["operator"] + (["initContainer"] if self.doca_driver else []) + (["nfd"] if self.own_nfd else [])
        if self.of_kind("rdma_shared", "both"):
            found.append("rdmaSharedDevicePlugin")
        vf_groups = self.of_kind("sriov", "both")
        if vf_groups:
            # The SR-IOV config daemon's init containers copy every CNI plugin the chart names
            # (sriov-network-operator's daemon manifest): Ethernet and IB SR-IOV and RDMA; the
            # values name no OVS plugin (gpuboot sets up no OVS offload).
            found += ["sriovOperator", "sriovConfigDaemon", "sriovDevicePlugin", "sriovCni", "ibSriovCni", "rdmaCni"]
        networks = self.networks()
        if networks:
            found += ["multus", "cniPlugins", "nvIpam"]
            found += ["ipoibCni"] if any(n["kind"] == "IPoIBNetwork" for n in networks) else []
        if self.bandwidth_tests():
            found.append("bandwidthTest")
        return tuple(found)

    def bandwidth_tests(self) -> list[dict]:
        """One RDMA bandwidth test (ib_write_bw) per InfiniBand NIC group with RDMA on two or
        more nodes, between its first two nodes over the group's RDMA resource; GPU memory on
        both ends through DMA-BUF when both have GPUs. Written for a person to run on real
        hardware, never part of the gate. RoCE groups get none: ib_write_bw there needs the
        GID index of each pod's RoCE v2 address, which only the running pods know."""
        tests = []
        for group in self.fabric:
            nic = group.nic
            if nic.link_type != "ib" or len(group.members) < 2:
                continue
            if group.kind in ("rdma_shared", "both"):
                resource = nic.shared_resource_name if group.kind == "both" else nic.resource_name
            elif nic.rdma and nic.device_type == "netdevice":
                resource = nic.resource_name
            else:
                continue
            server, client = list(group.members)[:2]
            tests.append({"name": f"rdma-bw-{group.name}", "group": group.name, "server": server, "client": client,
                          "resource": resource, "gpudirect": {server, client} <= self.gpu_nodes})
        return tests

    def shared_config(self) -> dict:
        """The RDMA shared device plugin's configuration (NicClusterPolicy rdmaSharedDevicePlugin.config)."""
        entries = []
        for group in self.of_kind("rdma_shared", "both"):
            name = group.nic.shared_resource_name if group.kind == "both" else group.nic.resource_name
            prefix, resource = name.split("/", 1)
            selectors: dict[str, list[str]] = {"vendors": [MELLANOX]}
            if group.union("pf_names"):
                selectors["ifNames"] = group.union("pf_names")
            else:
                selectors["deviceIDs"] = [d.split(":", 1)[1] for d in group.union("device_ids")]
            # The plugin names link types as netlink does.
            selectors["linkTypes"] = ["infiniband" if group.nic.link_type == "ib" else "ether"]
            entries.append({"resourceName": resource, "resourcePrefix": prefix, "rdmaHcaMax": group.nic.rdma_hca_max,
                            "selectors": selectors})
        return {"periodicUpdateInterval": SHARED_RESCAN_S, "configList": entries}

    def sriov_policies(self) -> list[dict]:
        policies = []
        for group in self.of_kind("sriov", "both"):
            nic = group.nic
            selector: dict = {"vendor": MELLANOX}
            if group.union("pf_names"):
                selector["pfNames"] = group.union("pf_names")
            elif group.union("pci_addresses"):
                selector["rootDevices"] = group.union("pci_addresses")
            else:
                selector["deviceID"] = group.union("device_ids")[0].split(":", 1)[1]
            policies.append({"name": f"gpuboot-{group.name}", "group": group.name, "label": group.label,
                             "resourceName": nic.resource_name.split("/", 1)[1], "numVfs": nic.num_vfs,
                             "deviceType": nic.device_type, "linkType": nic.link_type,
                             "isRdma": nic.rdma and nic.device_type == "netdevice", "nicSelector": selector})
        return policies

    def networks(self) -> list[dict]:
        """The secondary networks pods attach to, each with its nv-ipam pool."""
        found = []
        for group in self.fabric:
            network = group.nic.network
            if network is None:
                continue
            vfs = group.kind in ("sriov", "both")
            kind = (("SriovIBNetwork" if group.nic.link_type == "ib" else "SriovNetwork") if vfs
                    else ("IPoIBNetwork" if group.nic.link_type == "ib" else "MacvlanNetwork"))
            found.append({"name": network.name, "namespace": network.namespace, "kind": kind, "group": group.name,
                          "label": group.label, "pool": f"gpuboot-{group.name}",
                          "resourceName": group.nic.resource_name.split("/", 1)[1] if vfs else None,
                          "master": None if vfs else group.union("pf_names")[0],
                          "subnet": str(network.ip_pool.subnet),
                          "gateway": str(network.ip_pool.gateway) if network.ip_pool.gateway else None,
                          "perNodeBlockSize": network.ip_pool.per_node_block_size})
        return found

    def node_resources(self, node: str) -> dict[str, int | None]:
        """What the node must advertise: VFs per selected PF (unknown before discovery when
        selected by device id), the shared pool's rdmaHcaMax."""
        found: dict[str, int | None] = {}
        for nic in self.nodes.get(node, ()):
            for name, source in nic.resources.items():
                if source == "sriov":
                    ports = len(nic.pf_names) + len(nic.pci_addresses)
                    found[name] = nic.num_vfs * ports if ports else None
                else:
                    found[name] = nic.rdma_hca_max
        return found

    def node_labels(self) -> dict[str, dict[str, str]]:
        labels: dict[str, dict[str, str]] = {}
        for node, nics in self.nodes.items():
            groups = [self.groups[n.name] for n in nics if n.kind]
            if groups:
                labels[node] = {FABRIC_LABEL: "true", **{g.label: "true" for g in groups}}
        return labels

    def as_data(self) -> dict:
        """The resolution as Ansible reads it (extra variable gpuboot_network)."""
        return {
            "enabled": bool(self.fabric),
            "doca_driver": bool(self.fabric) and self.doca_driver,
            "operands": list(self.operands()),
            "nfd": self.own_nfd,
            "sriov": bool(self.of_kind("sriov", "both")),
            "rdma_shared": bool(self.of_kind("rdma_shared", "both")),
            "ipoib": any(n["kind"] == "IPoIBNetwork" for n in self.networks()),
            # The DOCA driver reload must unload NVMe/NFS over RDMA first where storage rides a NIC.
            "unload_storage_modules": any(nic.purpose == "storage" for nics in self.nodes.values() for nic in nics),
            "sriov_resource_prefix": self.sriov_resource_prefix,
            "shared_config": self.shared_config(),
            "sriov_policies": self.sriov_policies(),
            "networks": self.networks(),
            "bandwidth_tests": self.bandwidth_tests(),
            "fabric_label": FABRIC_LABEL,
            "node_labels": self.node_labels(),
            "nodes": {node: {
                "nics": [nic.model_dump(mode="json") for nic in nics],
                "resources": self.node_resources(node),
                # What acts on this node's ports: preflight checks each against the real ports.
                "reach": [{"group": g.name, "object": what, "selector": g.selector(shared=what != "SR-IOV policy")}
                          for g, what in self.reach(node)],
            } for node, nics in self.nodes.items()},
        }


class _Resolver:
    def __init__(self, settings: GpubootSettings, release: Release | None) -> None:
        self.settings, self.release = settings, release
        self.plan = NicPlan(doca_driver=settings.network_operator.driver == "container")

    def misfit(self, node: str, path: tuple, message: str, fix: str) -> None:
        self.plan.misfits.append(Misfit(node, path, message, fix))

    def node(self, node: Node) -> None:
        self.plan.nodes[node.name] = tuple(node.settings.nics)
        self.doca_container(node)
        if node.role == "gpu_worker":
            self.plan.gpu_nodes.add(node.name)
        for index, nic in enumerate(node.settings.nics):
            group = self.plan.groups.get(nic.name)
            if group is None:
                self.plan.groups[nic.name] = NicGroup(nic.name, nic, node.name, {node.name: nic})
                continue
            group.add(node.name, nic)
            for key in GROUP_FIELDS:
                mine, theirs = getattr(nic, key), getattr(group.nic, key)
                if mine != theirs:
                    path = ("nics", index) if key == "kind" else ("nics", index, key)
                    self.misfit(node.name, path,
                                f"NIC group {nic.name} has {key} {_shown(theirs)} on {group.first} and {_shown(mine)} "
                                f"here; one operator object serves the whole group",
                                f"give {nic.name} the same {key} on every node, or name these ports another group")
                    break
            else:
                if _way(nic) != _way(group.nic):
                    self.misfit(node.name, ("nics", index),
                                f"NIC group {nic.name} selects ports by {_way(group.nic)} on {group.first} and by "
                                f"{_way(nic)} here; its one policy lists one kind of selector",
                                f"select {nic.name}'s ports by {_way(group.nic)} on every node")

    def doca_container(self, node: Node) -> None:
        """A fabric node whose OS has no DOCA driver container needs the host's driver: the
        Network Operator refuses the OS (and NVIDIA's registry has no such image)."""
        os_id = node.settings.os or (self.settings.node_os.id if self.settings.node_os else None)
        if not self.plan.doca_driver or self.release is None or os_id is None:
            return
        if not any(nic.kind for nic in node.settings.nics):
            return
        try:
            key, packages, _ = self.release.os_for(os_id)
        except MatrixError:
            return  # reported where the OS is resolved (the GPU plan, the mirror plan)
        if packages.doca_driver_container:
            return
        with_one = [name for name, os in self.release.os.items() if os.doca_driver_container]
        self.misfit(node.name, ("os",) if node.settings.os else ("nics",),
                    f"NVIDIA publishes no DOCA driver container for {key}, and the Network Operator refuses "
                    "that OS for one",
                    "set gpuboot.network_operator.driver: host to use the nodes' own mlx5 driver (the kernel's, or "
                    f"DOCA-Host installed with the OS), or run the fabric nodes on {', '.join(with_one)}")

    def groups(self) -> None:
        owners: dict[str, str] = {}
        for group in self.plan.fabric:
            for name in group.nic.resources:
                if name in owners and owners[name] != group.name:
                    self._at_group(group, "resource_name", f"resource {name} is also NIC group {owners[name]}'s",
                                   "give each NIC group its own resource names")
                owners.setdefault(name, group.name)
            if group.kind in ("sriov", "both") and len(group.union("device_ids")) > 1:
                self._at_group(group, "device_ids",
                               f"NIC group {group.name} lists device ids {', '.join(group.union('device_ids'))}; an "
                               "SR-IOV policy selects one vendor:device",
                               "split the group by device id, or select its ports by pf_names")
        prefixes = {g.nic.resource_name.split("/", 1)[0]: g for g in self.plan.of_kind("sriov", "both")}
        if len(prefixes) > 1:
            group = list(prefixes.values())[1]
            self._at_group(group, "resource_name",
                           f"VF resources use the prefixes {', '.join(prefixes)}; the SR-IOV operator has one "
                           "resource prefix", f"name every VF resource {list(prefixes)[0]}/<name>")

    def reach(self) -> None:
        """A selector lists the names its nodes use: on every node it reaches, no port of that
        name may be declared as something else."""
        selects = {(g.name, key): set(g.union(key)) for g in self.plan.fabric
                   for key in ("pf_names", "pci_addresses", "device_ids")}
        for node, nics in self.plan.nodes.items():
            for group, what in self.plan.reach(node):
                for index, nic in enumerate(nics):
                    if nic.name == group.name:
                        continue
                    for key in ("pf_names", "pci_addresses", "device_ids"):
                        hit = selects[group.name, key] & {v.lower() if key == "pci_addresses" else v
                                                          for v in getattr(nic, key)}
                        if hit:
                            role = f"its {nic.purpose} NIC" if nic.purpose != "fabric" else "NIC group"
                            self.misfit(node, ("nics", index, key),
                                        f"{', '.join(sorted(hit))} here is {role} {nic.name}, but the {what} of NIC "
                                        f"group {group.name} selects {key} {', '.join(group.union(key))} on every "
                                        "node it reaches, so it would take this port too",
                                        f"name {group.name}'s ports so that no other node's {nic.purpose} port shares "
                                        f"a name with them, or select {group.name} by pci_addresses")

    def networks(self) -> None:
        taken: dict[tuple[str, str], str] = {}
        pools: list[tuple[IPv4Network, str]] = [(self.settings.networking.pod_cidr, "networking.pod_cidr"),
                                                 (self.settings.networking.service_cidr, "networking.service_cidr")]
        for group in self.plan.fabric:
            network = group.nic.network
            if network is None:
                continue
            key = (network.namespace, network.name)
            if key in taken:
                self._at_group(group, "network", f"network {network.namespace}/{network.name} is also NIC group "
                               f"{taken[key]}'s", "give each group's network its own name")
            taken[key] = group.name
            if group.kind == "rdma_shared" and len(group.union("pf_names")) != 1:
                self._at_group(group, "network",
                               f"a {'IPoIB' if group.nic.link_type == 'ib' else 'macvlan'} network has one parent "
                               f"interface, but NIC group {group.name} selects {group.union('pf_names') or 'ports by device id'}",
                               "put the network on a group of one port named alike on every node, or use VFs (num_vfs)")
            pool = network.ip_pool
            usable = pool.subnet.num_addresses - 2
            need = pool.per_node_block_size * len(group.members)
            if need > usable:
                self._at_group(group, "network",
                               f"ip_pool {pool.subnet} has {usable} usable addresses, but {len(group.members)} nodes x "
                               f"per_node_block_size {pool.per_node_block_size} need {need}",
                               "use a larger subnet or a smaller per_node_block_size")
            for other, owner in pools:
                if pool.subnet.overlaps(other):
                    self._at_group(group, "network", f"ip_pool {pool.subnet} overlaps {owner} ({other})",
                                   "give the secondary network a subnet of its own")
                    break
            pools.append((pool.subnet, f"NIC group {group.name}'s ip_pool"))

    def _at_group(self, group: NicGroup, key: str, message: str, fix: str) -> None:
        node = next(reversed(group.members))
        index = next(i for i, n in enumerate(self.plan.nodes[node]) if n.name == group.name)
        self.misfit(node, ("nics", index, key), message, fix)


def resolve(settings: GpubootSettings, nodes: list[Node] | tuple[Node, ...], release: Release | None = None) -> NicPlan:
    """What the Network Operator does with each node's NICs; with the release, each fabric
    node's OS is held against the DOCA driver containers NVIDIA publishes."""
    resolver = _Resolver(settings, release)
    resolver.plan.gpu_operator = any("gpu_workers" in node.groups for node in nodes)
    for node in nodes:
        if node.settings.nics:
            resolver.node(node)
    resolver.groups()
    resolver.reach()
    resolver.networks()
    return resolver.plan
