"""Checks that need more than one field: topology, addresses, references, secrets."""
from __future__ import annotations

import os
import re
import stat
from collections import defaultdict
from ipaddress import IPv4Address, ip_address
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuboot.config.inventory import AnsibleInventory, Where
from gpuboot.config.model import DNS_LABEL, HOST_NAME, SECRET_KEY, GpubootSettings, Node
from gpuboot.errors import MatrixError, Problem, dotted
from gpuboot.mirror import caches

SSH_PASSWORD_VARS = {"ansible_password", "ansible_ssh_pass", "ansible_ssh_password",
                     "ansible_become_password", "ansible_become_pass", "ansible_sudo_pass"}
SECRET_MARKERS = ("-----BEGIN", "$ANSIBLE_VAULT")
CLUSTER_GROUPS = ("control_plane", "workers")
# Every host belongs to one of these, or is named in gpuboot.ignored_hosts.
GPUBOOT_GROUPS = ("control_plane", "workers", "gpu_workers", "bastion", "mirror")
HOSTNAME = re.compile(HOST_NAME)
KERNEL = re.compile(r"^([0-9]+)\.([0-9]+)(\.([0-9]+))?([-.+_~][A-Za-z0-9._+~-]*)?$")


def inline_secrets(data: Any, where: Where, prefix: str, path: tuple = ()) -> list[Problem]:
    """Secrets must be referenced by file, never written into the inventory."""
    found: list[Problem] = []
    if isinstance(data, dict):
        for key, value in data.items():
            here = (*path, key)
            if SECRET_KEY.search(str(key)) and not str(key).endswith("_file"):
                found.append(Problem(where.file, where.child(*here).line, dotted(prefix, *here),
                                     "a secret is written inline",
                                     f"put it in a file only you can read and reference it as {key}_file"))
                continue
            found += inline_secrets(value, where, prefix, here)
    elif isinstance(data, list):
        for index, item in enumerate(data):
            found += inline_secrets(item, where, prefix, (*path, index))
    elif type(data).__name__ == "EncryptedString" or (isinstance(data, str) and any(m in data for m in SECRET_MARKERS)):
        found.append(Problem(where.file, where.child(*path).line, dotted(prefix, *path),
                             "key material or a vaulted secret is written inline",
                             "put it in a file only you can read and reference it with a *_file key"))
    return found


def groups_and_nodes(inv: AnsibleInventory, nodes: list[Node], settings: GpubootSettings | None) -> list[Problem]:
    problems: list[Problem] = []
    file = str(inv.path.absolute())
    cps = [n for n in nodes if "control_plane" in n.groups]
    ignored: set[str] = set()
    for pattern in settings.ignored_hosts if settings else []:
        ignored |= set(inv.hosts_matching(pattern))
    for node in nodes:
        if not node.groups & set(GPUBOOT_GROUPS) and node.name not in ignored:
            own = sorted(node.groups - {"all", "ungrouped"})
            problems.append(Problem(node.file, node.line, node.name,
                                    f"host is in no gpuboot group ({', '.join(own) or 'in no group at all'}), "
                                    "so gpuboot would leave it out",
                                    f"add it to one of {', '.join(GPUBOOT_GROUPS)}, or list it (or its group) "
                                    "under gpuboot.ignored_hosts"))
    if "gpu_workers" in inv.group_children and "workers" not in inv.ancestors("gpu_workers"):
        problems.append(Problem(file, None, "gpu_workers", "gpu_workers must be a child group of workers",
                                "move gpu_workers under workers.children"))
    # Located at the group, where the count is decided (else at its first host).
    group_line = inv.group_line("control_plane")
    if not cps:
        problems.append(Problem(file, group_line, "control_plane", "no control-plane hosts: etcd needs an odd number "
                                "(1, 3 or 5) for quorum", "add 1, 3 or 5 hosts to the control_plane group"))
    elif len(cps) % 2 == 0:
        first = cps[0]
        problems.append(Problem(file if group_line else first.file, group_line or first.line, "control_plane",
                                f"{len(cps)} control-plane hosts ({', '.join(n.name for n in cps)}): etcd needs an "
                                "odd number for quorum",
                                f"use {len(cps) - 1} or {len(cps) + 1} control-plane hosts"))
    by_lower: dict[str, list[Node]] = defaultdict(list)
    for node in nodes:
        by_lower[node.name.lower()].append(node)
        in_cluster = node.groups & set(CLUSTER_GROUPS)
        bad_labels = [label for label in node.name.split(".") if not re.match(DNS_LABEL, label)]
        if in_cluster and (bad_labels or len(node.name) > 253):
            shown = ", ".join(repr(label) for label in bad_labels) or "the whole name is over 253 characters"
            problems.append(Problem(node.file, node.line, node.name,
                                    f"host name is not a valid Kubernetes node name ({shown})",
                                    "use lowercase letters, digits and '-' in every dot-separated part "
                                    "(e.g. gpu-node-01 or h200-04.site-a.internal)"))
        if {"control_plane", "workers"} <= node.groups:
            problems.append(Problem(node.file, node.line, node.name,
                                    "host is in both control_plane and workers",
                                    "a node is either a control plane or a worker; remove it from one group"))
        gpu_here = node.settings.gpu is not None
        if gpu_here and "gpu_workers" not in node.groups:
            problems.append(Problem(node.file, node.line, f"{node.name}.gpuboot_node.gpu",
                                    "GPU settings on a host that is not in gpu_workers",
                                    "move the host into gpu_workers, or remove its gpu settings"))
        if node.settings.nics and "workers" not in node.groups:
            problems.append(Problem(node.file, node.line, f"{node.name}.gpuboot_node.nics",
                                    "RDMA/SR-IOV NICs on a host that is not a worker",
                                    "NIC settings belong on workers (usually gpu_workers)"))
        problems += _nic_duplicates(node)
    for same in by_lower.values():
        if len(same) > 1:
            problems.append(Problem(same[1].file, same[1].line, same[1].name,
                                    f"duplicate host name: {', '.join(n.name for n in same)} are one name to DNS and Kubernetes",
                                    "rename one of them"))
    by_address: dict[tuple[str, int], list[Node]] = defaultdict(list)
    for node in nodes:
        if node.groups & set(CLUSTER_GROUPS):
            by_address[(node.address, node.port)].append(node)
    for (address, _), same in by_address.items():
        if len(same) > 1:
            problems.append(Problem(same[1].file, same[1].line, f"{same[1].name}.ansible_host",
                                    f"address {address} is also used by {same[0].name}",
                                    "give every node its own ansible_host"))
    return problems


def _nic_duplicates(node: Node) -> list[Problem]:
    """A port, a PCI address, a NIC name or a resource may be claimed by one NIC only."""
    problems: list[Problem] = []
    for what, values, fix in (
            ("NIC name", [nic.name for nic in node.settings.nics], "give each NIC its own name"),
            ("resource", [r for nic in node.settings.nics for r in nic.resources], "give each NIC its own resource names"),
            ("PF", [pf for nic in node.settings.nics for pf in nic.pf_names], "list each port under one NIC, once"),
            ("PCI address", [a.lower() for nic in node.settings.nics for a in nic.pci_addresses],
             "list each PCI address under one NIC, once"),
            ("vendor:device", [d for nic in node.settings.nics for d in nic.device_ids],
             "select a device id under one NIC only, or select those ports by pf_names")):
        for dup in sorted({v for v in values if values.count(v) > 1}):
            problems.append(Problem(node.file, node.line, f"{node.name}.gpuboot_node.nics",
                                    f"{what} {dup} appears {values.count(dup)} times on this node", fix))
    return problems


def host_address(name: str, address: str, where: Where) -> list[Problem]:
    """ansible_host must be an IP address or a DNS name: anything else reaches ssh and configs."""
    try:
        ip_address(address)  # IPv4 or IPv6
        return []
    except ValueError:
        if len(address) <= 253 and HOSTNAME.match(address):
            return []
    return [Problem(where.file, where.line, f"{name}.ansible_host",
                    f"{address!r} is neither an IP address nor a DNS name",
                    "write the node's address (e.g. 10.20.1.21) or its DNS name")]


def _ip(value: str) -> IPv4Address | None:
    try:
        address = ip_address(value)
    except ValueError:
        return None
    return address if isinstance(address, IPv4Address) else None


def addresses(settings: GpubootSettings, nodes: list[Node], where: Where) -> list[Problem]:
    problems: list[Problem] = []
    net = settings.networking
    vip = settings.control_plane.vip
    line_pod = where.child("networking", "pod_cidr").line
    if net.pod_cidr.overlaps(net.service_cidr):
        problems.append(Problem(where.file, line_pod, "gpuboot.networking",
                                f"pod_cidr {net.pod_cidr} overlaps service_cidr {net.service_cidr}",
                                "choose networks that do not overlap, e.g. 10.244.0.0/16 and 10.96.0.0/12"))
    pool = net.calico.ip_pool_cidr
    if pool is not None and not pool.subnet_of(net.pod_cidr):
        # The operator stalls on a pool outside kubeadm's podSubnet (tigera/operator#2712).
        problems.append(Problem(where.file, where.child("networking", "calico", "ip_pool_cidr").line,
                                "gpuboot.networking.calico.ip_pool_cidr",
                                f"the Calico IP pool {pool} is not inside pod_cidr {net.pod_cidr} (kubeadm's podSubnet)",
                                f"leave ip_pool_cidr out (the pool is then {net.pod_cidr}) or choose a part of it"))
    if pool is not None and pool.prefixlen > net.calico.block_size:
        problems.append(Problem(where.file, where.child("networking", "calico", "ip_pool_cidr").line,
                                "gpuboot.networking.calico.ip_pool_cidr",
                                f"the Calico IP pool {pool} is smaller than one block (/{net.calico.block_size})",
                                "choose a larger pool or a smaller block_size"))
    for field, cidr in (("pod_cidr", net.pod_cidr), ("service_cidr", net.service_cidr)):
        if vip in cidr:
            problems.append(Problem(where.file, where.child("control_plane", "vip").line,
                                    "gpuboot.control_plane.vip",
                                    f"VIP {vip} is inside the {field} {cidr}",
                                    "use an address on the nodes' own network"))
        for node in nodes:
            addr = _ip(node.address)
            if addr is not None and addr in cidr and node.groups & set(CLUSTER_GROUPS):
                problems.append(Problem(node.file, node.line, f"{node.name}.ansible_host",
                                        f"node address {addr} is inside the {field} {cidr}",
                                        f"choose a {field} that does not contain the node network"))
    vip_where = where.child("control_plane", "vip")
    for node in nodes:
        if _ip(node.address) == vip:
            problems.append(Problem(vip_where.file, vip_where.line, "gpuboot.control_plane.vip",
                                    f"the VIP {vip} is {node.name}'s address (ansible_host at {node.file}:{node.line})",
                                    "the VIP must be a free address on the control planes' network: change the vip "
                                    f"here, or {node.name}'s ansible_host"))
    return problems


def resolve_path(path: str, inventory_dir: Path) -> Path:
    """A path from the inventory: ~ expanded, relative ones from the inventory's folder."""
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else inventory_dir / p


def references(settings: GpubootSettings, nodes: list[Node], where: Where, inventory: Path,
               *, check_files: bool) -> list[Problem]:
    problems: list[Problem] = []
    jump = settings.ssh.jump_host
    if jump:
        bastions = {n.name for n in nodes if "bastion" in n.groups}
        if jump not in bastions and _ip(jump) is None:
            problems.append(Problem(where.file, where.child("ssh", "jump_host").line, "gpuboot.ssh.jump_host",
                                    f"jump host {jump!r} is neither a host in the bastion group nor an IP address",
                                    f"add it to the bastion group{' (have: ' + ', '.join(sorted(bastions)) + ')' if bastions else ''}"))
    if not check_files:
        return problems
    mirror = settings.mirror
    refs = [(("ssh", "private_key_file"), settings.ssh.private_key_file),
            (("mirror", "ca_file"), mirror.ca_file),
            (("mirror", "credentials_file"), mirror.credentials_file),
            (("mirror", "packages_key_file"), mirror.packages_key_file),
            (("mirror", "tls_cert_file"), mirror.tls_cert_file),
            (("mirror", "tls_key_file"), mirror.tls_key_file)]
    refs += [(("executors", index, key), getattr(executor, key))
             for index, executor in enumerate(settings.executors) for key in ("private_key_file", "known_hosts_file")]
    if settings.gitops:
        refs.append((("gitops", "credentials_file"), settings.gitops.credentials_file))
        refs.append((("gitops", "known_hosts_file"), settings.gitops.known_hosts_file))
    for path, value in refs:
        if value:
            secret = path in SECRET_FILES or path[-1] == "private_key_file"
            found = _file_problem(value, inventory.parent, secret=secret)
            if found:
                problems.append(Problem(where.file, where.child(*path).line, dotted("gpuboot", *path), *found))
    return problems


# Files whose content is a secret: gpuboot refuses them readable by anyone but their owner,
# as ssh refuses such a private key.
SECRET_FILES = {("ssh", "private_key_file"), ("mirror", "credentials_file"), ("mirror", "tls_key_file"),
                ("gitops", "credentials_file")}


def _file_problem(value: str, inventory_dir: Path, *, secret: bool) -> tuple[str, str] | None:
    """What is wrong with a file the inventory names, as (message, fix), or None.

    A relative path is the inventory's own file: it must stay inside the inventory's folder
    once '..' and symlinks are resolved (an inventory from a shared repository must not be
    able to point gpuboot at the operator's other files and copy them to the nodes). An
    absolute path (or ~) is the operator's explicit choice."""
    path = resolve_path(value, inventory_dir)
    if not path.exists():
        return (f"file {value} does not exist",
                "create it, or fix the path (relative paths start at the inventory's folder)")
    if not Path(os.path.expanduser(value)).is_absolute():
        real, base = path.resolve(), inventory_dir.resolve()
        if not real.is_relative_to(base):
            how = "'..'" if ".." in Path(value).parts else "a symlink"
            return (f"{value} resolves to {real}, outside the inventory's folder {base} (through {how})",
                    "write the file's absolute path if it belongs elsewhere, or put the file itself in the "
                    "inventory's folder")
    if not path.is_file():
        return f"{value} is not a regular file", "point it at the file itself"
    mode = path.stat().st_mode
    if secret and mode & 0o077:
        return (f"{value} holds a secret and is readable by others (mode {stat.S_IMODE(mode):04o})",
                f"chmod 600 {path}")
    return None


def node_os(settings: GpubootSettings, release, where: Where) -> list[Problem]:
    """The declared node OS must be one the release supports, its kernels real and new enough."""
    declared = settings.node_os
    if declared is None:
        return []
    problems: list[Problem] = []
    try:
        release.os_for(declared.id)
    except MatrixError as exc:
        problems.append(Problem(where.file, where.child("node_os", "id").line, "gpuboot.node_os.id",
                                exc.message, exc.hint))
    min_kernel = getattr(release, "min_kernel", None) or (release.model_extra or {}).get("min_kernel")
    for index, kernel in enumerate(declared.kernels):
        path = ("node_os", "kernels", index)
        version = kernel_version(kernel)
        if version is None:
            problems.append(Problem(where.file, where.child(*path).line, f"gpuboot.node_os.kernels[{index}]",
                                    f"{kernel!r} is not a kernel release string",
                                    "write what `uname -r` prints on the node, e.g. 5.15.0-1048-nvidia"))
        elif min_kernel and version < kernel_version(str(min_kernel)):
            problems.append(Problem(where.file, where.child(*path).line, f"gpuboot.node_os.kernels[{index}]",
                                    f"kernel {kernel} is older than {min_kernel}, the oldest release {release.name} "
                                    "supports (GPUDirect over DMA-BUF needs it)",
                                    f"upgrade the nodes to a kernel {min_kernel} or newer and list that one"))
    return problems


def kernel_version(kernel: str) -> tuple[int, int, int] | None:
    match = KERNEL.match(kernel)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(4) or 0)


GPU = "nvidia.com/gpu"
# Namespaces of the cluster itself and of what gpuboot installs: a tenant bundle there would
# put a quota and a default-deny policy on the cluster's own pods.
RESERVED_NAMESPACES = frozenset({"default", "argocd", "gpu-operator", "nvidia-network-operator", "tigera-operator",
                                 "calico-system", "calico-apiserver", "kai-scheduler", "kai-resource-reservation",
                                 "kai-scale-adjust"})


def tenants(settings: GpubootSettings, offered: dict[str, int] | None, where: Where,
            by_group: dict[str, dict[str, int] | None] | None = None) -> list[Problem]:
    """The tenants' quotas fit what the GPU workers offer (`offered`, from the GPU plan: time-slicing
    replicas and MIG devices counted as the device plugin advertises them; None when a GPU worker
    does not declare its count, and then only what can be known is checked); the quotas of the
    tenants bound to a node group fit what that group's GPU nodes offer (`by_group`)."""
    problems: list[Problem] = _node_group_quotas(settings, by_group or {}, where)
    asked = sum(t.quota.gpu for t in settings.tenants)
    if settings.tenants and offered is not None and asked > offered.get(GPU, 0):
        index = max(range(len(settings.tenants)), key=lambda i: settings.tenants[i].quota.gpu)
        shares = ", ".join(f"{t.name} {t.quota.gpu}" for t in settings.tenants if t.quota.gpu)
        problems.append(Problem(where.file, where.child("tenants", index, "quota", "gpu").line,
                                f"gpuboot.tenants[{index}].quota.gpu",
                                f"the tenants' GPU quotas add up to {asked} ({shares}), but the GPU workers "
                                f"offer {offered.get(GPU, 0)} {GPU} (gpu.count x time_slicing_replicas, "
                                "less the GPUs their MIG layouts partition)",
                                "lower the quotas or declare the GPUs the nodes really have"))
    problems += _mig_quotas(settings, offered, where)
    seen: dict[str, int] = {}
    for index, tenant in enumerate(settings.tenants):
        if tenant.name in RESERVED_NAMESPACES or tenant.name.startswith("kube-"):
            problems.append(Problem(where.file, where.child("tenants", index, "name").line,
                                    f"gpuboot.tenants[{index}].name",
                                    f"{tenant.name} is a namespace of the cluster itself or of an add-on gpuboot "
                                    "installs: a tenant's quota and default-deny policy would apply to its pods",
                                    "give the tenant a name of its own"))
        if tenant.name in seen:
            problems.append(Problem(where.file, where.child("tenants", index).line, f"gpuboot.tenants[{index}].name",
                                    f"tenant {tenant.name} is defined twice (also tenants[{seen[tenant.name]}])",
                                    "merge them or rename one"))
        seen.setdefault(tenant.name, index)
    return problems


def _node_group_quotas(settings: GpubootSettings, by_group: dict[str, dict[str, int] | None],
                       where: Where) -> list[Problem]:
    """Each node group tenants are bound to holds GPU workers, and their quotas (GPUs as the
    device plugin counts them there: time-sliced replicas; MIG devices per profile) fit it."""
    problems: list[Problem] = []
    bound: dict[str, list[int]] = defaultdict(list)
    for index, tenant in enumerate(settings.tenants):
        if tenant.node_group:
            bound[tenant.node_group].append(index)
    with_gpus = sorted(group for group, have in by_group.items() if have != {})
    for group, indexes in sorted(bound.items()):
        if group not in by_group:
            continue  # not worked out (the release did not load): nothing to say about it
        have = by_group[group]
        first = indexes[0]
        line = where.child("tenants", first, "node_group").line
        if have == {}:
            problems.append(Problem(where.file, line, f"gpuboot.tenants[{first}].node_group",
                                    f"the node group {group} holds no GPU worker of this inventory",
                                    "name an inventory group of GPU workers" + (f" ({', '.join(with_gpus)})" if with_gpus else
                                                                               ", or put the tenant's nodes in a group")))
            continue
        if have is None:
            continue  # a node of the group does not declare its GPU count: nothing to add up
        for resource in sorted({GPU} | {f"nvidia.com/mig-{p}" for i in indexes for p in settings.tenants[i].quota.mig}):
            profile = resource.removeprefix("nvidia.com/mig-")
            shares = [(i, settings.tenants[i].quota.gpu if resource == GPU else settings.tenants[i].quota.mig.get(profile, 0))
                      for i in indexes]
            asked = sum(count for _, count in shares)
            if asked > have.get(resource, 0):
                index = max(shares, key=lambda share: share[1])[0]
                field = ("quota", "gpu") if resource == GPU else ("quota", "mig", profile)
                names = ", ".join(f"{settings.tenants[i].name} {count}" for i, count in shares if count)
                problems.append(Problem(where.file, where.child("tenants", index, *field).line,
                                        dotted("gpuboot", "tenants", index, *field),
                                        f"the quotas of the tenants on node group {group} add up to {asked} {resource} "
                                        f"({names}), but its GPU nodes offer {have.get(resource, 0)}"
                                        + (" (gpu.count x time_slicing_replicas)" if resource == GPU else ""),
                                        f"lower the quotas, or add GPU nodes to {group}"))
    return problems


def vclusters(settings: GpubootSettings, nodes: list[Node], where: Where) -> list[Problem]:
    """A tenant's vCluster comes through the GitOps repository, its control plane runs as root, and
    its network policy names the API servers by their addresses."""
    problems: list[Problem] = []
    named = [n for n in nodes if "control_plane" in n.groups and not _is_ipv4(n.address)]
    for index, tenant in enumerate(settings.tenants):
        if not tenant.vcluster.enabled:
            continue
        place = where.child("tenants", index, "vcluster", "enabled")
        if named:
            problems.append(Problem(where.file, place.line, f"gpuboot.tenants[{index}].vcluster.enabled",
                                    f"tenant {tenant.name}'s vCluster reaches the API servers through a network policy "
                                    "that names them by IP address, and "
                                    + ", ".join(f"{n.name} is at {n.address!r}" for n in named[:3]),
                                    "give the control planes their IP addresses as ansible_host"))
        if settings.gitops is None:
            problems.append(Problem(where.file, place.line, f"gpuboot.tenants[{index}].vcluster.enabled",
                                    f"tenant {tenant.name}'s vCluster is installed by Argo CD from the GitOps "
                                    "repository, and this inventory has no gpuboot.gitops",
                                    "set gpuboot.gitops (repo_url, credentials_file, known_hosts_file), or turn the "
                                    "vCluster off"))
        if tenant.pod_security == "restricted":
            problems.append(Problem(where.file, place.line, f"gpuboot.tenants[{index}].vcluster.enabled",
                                    f"tenant {tenant.name} enforces pod security restricted, and vCluster's control "
                                    "plane runs as root (the chart's default): its pod would be refused",
                                    "set the tenant's pod_security to baseline, or turn the vCluster off"))
    return problems


def _is_ipv4(text: str) -> bool:
    try:
        IPv4Address(text)
    except ValueError:
        return False
    return True


def kai_scheduler(settings: GpubootSettings, where: Where) -> list[Problem]:
    """KAI comes through the GitOps repository, and its queues are named after the tenants."""
    kai = settings.kai_scheduler
    if not kai.enabled:
        return []
    problems: list[Problem] = []
    if settings.gitops is None:
        problems.append(Problem(where.file, where.child("kai_scheduler", "enabled").line, "gpuboot.kai_scheduler.enabled",
                                "the KAI scheduler is installed by Argo CD from the GitOps repository, and this "
                                "inventory has no gpuboot.gitops",
                                "set gpuboot.gitops (repo_url, credentials_file, known_hosts_file), or turn "
                                "kai_scheduler off"))
    if not settings.tenants:
        problems.append(Problem(where.file, where.child("kai_scheduler", "enabled").line, "gpuboot.kai_scheduler.enabled",
                                "the KAI scheduler's queues come from gpuboot.tenants, and there are none: with its "
                                "default queue off, KAI would schedule no pod",
                                "define the tenants (gpuboot.tenants), or turn kai_scheduler off"))
    for index, tenant in enumerate(settings.tenants):
        if tenant.name == kai.parent_queue:
            problems.append(Problem(where.file, where.child("tenants", index, "name").line,
                                    f"gpuboot.tenants[{index}].name",
                                    f"tenant {tenant.name} has the name of the KAI parent queue its queue would hang "
                                    "under (queues are named after tenants)",
                                    "rename the tenant or set gpuboot.kai_scheduler.parent_queue"))
    return problems


def _mig_quotas(settings: GpubootSettings, offered: dict[str, int] | None, where: Where) -> list[Problem]:
    problems: list[Problem] = []
    asked: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for index, tenant in enumerate(settings.tenants):
        for profile, count in tenant.quota.mig.items():
            asked[profile].append((index, count))
    for profile, shares in sorted(asked.items()):
        index = max(shares, key=lambda share: share[1])[0]
        place = (f"gpuboot.tenants[{index}].quota.mig.{profile}",
                 where.child("tenants", index, "quota", "mig", profile).line)
        if settings.gpu_operator.mig_strategy == "single":
            problems.append(Problem(where.file, place[1], place[0],
                                    f"a quota on nvidia.com/mig-{profile}, but with mig_strategy single every MIG "
                                    f"device is advertised as {GPU}",
                                    "count MIG devices in quota.gpu, or set gpuboot.gpu_operator.mig_strategy: mixed"))
            continue
        if offered is None:
            continue
        have = offered.get(f"nvidia.com/mig-{profile}", 0)
        total = sum(count for _, count in shares)
        if total > have:
            names = ", ".join(f"{settings.tenants[i].name} {count}" for i, count in shares)
            mig = sorted(name.removeprefix("nvidia.com/mig-") for name in offered if name.startswith("nvidia.com/mig-"))
            problems.append(Problem(where.file, place[1], place[0],
                                    f"the tenants' quotas on nvidia.com/mig-{profile} add up to {total} ({names}), "
                                    f"but the GPU workers' MIG layouts make {have}",
                                    "lower the quotas or change the layouts; the layouts make: "
                                    + (", ".join(f"{p} {offered['nvidia.com/mig-' + p]}" for p in mig) or "no MIG devices")))
    return problems


def mirror_caches(settings: GpubootSettings, release, where: Where) -> list[Problem]:
    """A connected site's caches: each remote names an upstream the release pulls from, and
    the caches' ports (the mirror's port + 1 onwards) fit and leave the package port alone."""
    mirror = settings.mirror
    upstreams = list(release.upstream_registries)
    problems = [Problem(where.file, where.child("mirror", "cache_remotes", name).line,
                        dotted("gpuboot", "mirror", "cache_remotes", name),
                        f"{name!r} is not a registry release {release.name} pulls from, so it has no cache",
                        f"use one of: {', '.join(upstreams)}")
                for name in mirror.cache_remotes if name not in upstreams]
    planned = caches.caches(mirror.registry, mirror.air_gapped, upstreams, mirror.cache_remotes)
    if not planned:
        return problems
    first, last = planned[0].port, planned[-1].port
    if last > caches.HIGHEST_PORT:
        problems.append(Problem(where.file, where.child("mirror", "registry").line, "gpuboot.mirror.registry",
                                f"the {len(planned)} pull-through caches take the ports after the mirror's "
                                f"({first}-{last}), past {caches.HIGHEST_PORT}",
                                f"give the mirror a port below {caches.HIGHEST_PORT - len(planned)}"))
    packages = urlsplit(mirror.packages_url) if mirror.packages_url else None
    if packages and packages.hostname == planned[0].host and first <= (packages.port or 443) <= last:
        problems.append(Problem(where.file, where.child("mirror", "packages_url").line, "gpuboot.mirror.packages_url",
                                f"port {packages.port or 443} is taken by the pull-through caches ({first}-{last}: "
                                "the ports after the mirror registry's)",
                                f"serve the packages on a port outside {first}-{last}"))
    return problems
