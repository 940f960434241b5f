"""Inventory -> validated Cluster, or an InventoryError listing every problem."""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from gpuboot import gpu_plan, matrix, nic_plan
from gpuboot.config import checks
from gpuboot.config.errors_map import problems_from
from gpuboot.config.inventory import AnsibleInventory, Where, read_inventory
from gpuboot.config.model import Cluster, GpubootSettings, Node, NodeSettings
from gpuboot.errors import InventoryError, MatrixError, Problem, dotted

SETTINGS_VAR = "gpuboot"
NODE_VAR = "gpuboot_node"


def _settings(inv: AnsibleInventory) -> tuple[GpubootSettings | None, Where | None, list[Problem]]:
    file = str(inv.path)
    scoped = [(owner, where) for var, owner, where in inv.scoped_definitions if var == SETTINGS_VAR]
    if scoped:
        return None, None, [Problem(w.file, w.line, SETTINGS_VAR,
                                    f"gpuboot must be set for the whole inventory, not for {owner}",
                                    "move it under all.vars or into group_vars/all.yml") for owner, w in scoped]
    places = inv.all_definitions.get(SETTINGS_VAR, [])
    if not places:
        return None, None, [Problem(file, None, SETTINGS_VAR, "the gpuboot settings are missing",
                                    "add `gpuboot:` under all.vars, or in group_vars/all.yml beside the inventory")]
    if len(places) > 1:
        listed = ", ".join(f"{w.file}:{w.line}" for w in places)
        return None, None, [Problem(places[-1].file, places[-1].line, SETTINGS_VAR,
                                    f"gpuboot is defined in {len(places)} places ({listed}); Ansible keeps only the last",
                                    "keep one definition, for the group all")]
    where = places[0]
    data = where.root
    if not isinstance(data, dict):
        return None, None, [Problem(where.file, where.line, SETTINGS_VAR, "gpuboot must be a mapping",
                                    "see inventories/sample/inventory.yml")]
    problems = checks.inline_secrets(data, where, SETTINGS_VAR)
    try:
        return GpubootSettings.model_validate(data), where, problems
    except ValidationError as exc:
        return None, where, problems + problems_from(exc, GpubootSettings, where, SETTINGS_VAR)


def _nodes(inv: AnsibleInventory, default_port: int) -> tuple[list[Node], list[Problem]]:
    nodes: list[Node] = []
    problems: list[Problem] = []
    for host in inv.hosts.values():
        settings = NodeSettings()
        raw = host.vars.get(NODE_VAR)
        if raw is not None:
            where = host.where(NODE_VAR)
            problems += checks.inline_secrets(raw, where, f"{host.name}.{NODE_VAR}")
            try:
                settings = NodeSettings.model_validate(raw)
            except ValidationError as exc:
                problems += problems_from(exc, NodeSettings, where, f"{host.name}.{NODE_VAR}")
        for key in sorted(checks.SSH_PASSWORD_VARS & set(host.vars)):
            w = host.where(key)
            problems.append(Problem(w.file, w.line, f"{host.name}.{key}",
                                    "an SSH or become password is written inline",
                                    "use SSH keys (gpuboot.ssh.private_key_file) and passwordless sudo"))
        address = str(host.vars.get("ansible_host", host.name))
        problems += checks.host_address(host.name, address, host.where("ansible_host"))
        port = host.vars.get("ansible_port", default_port)
        nodes.append(Node(
            name=host.name,
            address=address,
            port=int(port) if str(port).isdigit() else default_port,
            groups=frozenset(host.groups),
            settings=settings,
            file=host.file,
            line=host.line,
        ))
    return nodes, problems


def _misfits(inv: AnsibleInventory, misfits: list[gpu_plan.Misfit]) -> list[Problem]:
    """The GPU and NIC plans' misfits, each at its place under the node's gpuboot_node."""
    problems = []
    for misfit in misfits:
        where = inv.hosts[misfit.node].where(NODE_VAR).child(*misfit.path)
        path = dotted(misfit.node, NODE_VAR, *misfit.path)
        problems.append(Problem(where.file, where.line, path, misfit.message, misfit.fix))
    return problems


def resolve_plans(cluster: Cluster) -> tuple[gpu_plan.GpuPlan, nic_plan.NicPlan]:
    """The GPU and NIC plans of a loaded cluster at its release (Cluster.gpu_plan/nic_plan)."""
    release = matrix.load(cluster.settings.release)
    return (gpu_plan.resolve(cluster.settings, release, cluster.nodes),
            nic_plan.resolve(cluster.settings, cluster.nodes, release))


def load_cluster(path: str | Path, *, check_files: bool = False, releases_dir: Path | None = None) -> Cluster:
    """Read and validate an inventory without touching any host. The first read skips
    Ansible's per-value origin tags (most of the time of a large inventory); an inventory
    with problems is read again with them, so that each problem names its file and line."""
    path = Path(path)
    if not path.is_file():
        raise InventoryError([Problem(str(path), None, "", "no such inventory file",
                                      "pass the path of an Ansible inventory file (YAML or INI)")])
    with _cyclic_gc_paused():
        try:
            return _validated(path, check_files, releases_dir, located=False)
        except InventoryError:
            return _validated(path, check_files, releases_dir, located=True)


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Reading an inventory allocates millions of small objects that all stay alive: Python's
    cyclic collector scans them again and again and frees nothing (more than half the time of
    a 2,000-host read). Paused while reading; what was read is then frozen out of its scans
    (it lives as long as the command that read it; without the freeze, the first full
    collection after the read costs as much again)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _validated(path: Path, check_files: bool, releases_dir: Path | None, *, located: bool) -> Cluster:
    inv = read_inventory(path, located=located)
    if inv.manager is None:
        raise InventoryError(inv.problems)
    problems = list(inv.problems)
    settings, where, found = _settings(inv)
    problems += found
    default_port = settings.ssh.port if settings else 22
    nodes, found = _nodes(inv, default_port)
    problems += found
    problems += checks.groups_and_nodes(inv, nodes, settings)
    if settings is not None and where is not None:
        offered = None
        by_group: dict[str, dict[str, int] | None] = {}
        release = None
        try:
            release = matrix.load(settings.release, releases_dir)
        except MatrixError as exc:
            problems.append(Problem(where.file, where.child("release").line, "gpuboot.release",
                                    f"{settings.release!r}: {exc.message}", exc.hint))
        else:
            problems += checks.node_os(settings, release, where)
            problems += checks.mirror_caches(settings, release, where)
            plan = gpu_plan.resolve(settings, release, nodes)
            problems += _misfits(inv, plan.misfits)
            # A layout with a problem of its own would make the quotas' check say more of the same.
            offered = None if plan.misfits else plan.offered()
            for group in {t.node_group for t in settings.tenants if t.node_group}:
                members = {n.name for n in nodes if group in n.groups and n.name in plan.nodes}
                by_group[group] = (None if plan.misfits else plan.offered(members)) if members else {}
        problems += _misfits(inv, nic_plan.resolve(settings, nodes, release).misfits)
        problems += checks.addresses(settings, nodes, where)
        problems += checks.references(settings, nodes, where, inv.path, check_files=check_files)
        problems += checks.tenants(settings, offered, where, by_group)
        problems += checks.kai_scheduler(settings, where)
        problems += checks.vclusters(settings, nodes, where)
    if problems:
        raise InventoryError(problems)
    assert settings is not None
    cluster = Cluster(inventory=str(path), settings=settings, nodes=tuple(nodes), source_files=tuple(inv.files))
    cluster.attach_resolver(resolve_plans)
    cluster.attach_inventory(inv)
    return cluster
