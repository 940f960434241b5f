"""Inventory file -> validated Cluster, or an InventoryError listing every problem."""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from gpuboot import matrix
from gpuboot.config import checks
from gpuboot.config.errors_map import problems_from
from gpuboot.config.inventory import RawInventory, Where, read_inventory
from gpuboot.config.model import Cluster, GpubootSettings, Node, NodeSettings
from gpuboot.errors import InventoryError, MatrixError, Problem


def _settings(inv: RawInventory) -> tuple[GpubootSettings | None, Where | None, list[Problem]]:
    sources = inv.var_sources("gpuboot")
    file = str(inv.path)
    if not sources:
        return None, None, [Problem(file, None, "gpuboot", "the gpuboot settings are missing",
                                    "add `gpuboot:` under all.vars, or in group_vars/all.yml beside the inventory")]
    if len(sources) > 1:
        places = ", ".join(f"{w.file}:{w.line}" for _, w in sources)
        _, where = sources[0]
        return None, None, [Problem(where.file, where.line, "gpuboot",
                                    f"gpuboot is defined in {len(sources)} places ({places})",
                                    "keep one definition, for the group all")]
    data, where = sources[0]
    if inv.groups["all"].var_where.get("gpuboot") is not where:
        return None, None, [Problem(where.file, where.line, "gpuboot",
                                    "gpuboot must be set for the whole inventory, not for one group or host",
                                    "move it under all.vars or into group_vars/all.yml")]
    if not isinstance(data, dict):
        return None, None, [Problem(where.file, where.line, "gpuboot", "gpuboot must be a mapping",
                                    "see inventories/sample/inventory.yml")]
    problems = checks.inline_secrets(data, where, "gpuboot")
    try:
        return GpubootSettings.model_validate(data), where, problems
    except ValidationError as exc:
        return None, where, problems + problems_from(exc, GpubootSettings, where, "gpuboot")


def _nodes(inv: RawInventory, default_port: int) -> tuple[list[Node], list[Problem]]:
    nodes, problems = [], []
    for host in inv.hosts.values():
        settings = NodeSettings()
        raw = host.vars.get("gpuboot_node")
        if raw is not None:
            where = host.var_where["gpuboot_node"]
            problems += checks.inline_secrets(raw, where, f"{host.name}.gpuboot_node")
            try:
                settings = NodeSettings.model_validate(raw)
            except ValidationError as exc:
                problems += problems_from(exc, NodeSettings, where, f"{host.name}.gpuboot_node")
        for key in checks.SSH_PASSWORD_VARS & set(host.vars):
            w = host.var_where[key]
            problems.append(Problem(w.file, w.line, f"{host.name}.{key}",
                                    "an SSH or become password is written inline",
                                    "use SSH keys (gpuboot.ssh.private_key_file) and passwordless sudo"))
        port = host.vars.get("ansible_port", default_port)
        nodes.append(Node(
            name=host.name,
            address=str(host.vars.get("ansible_host", host.name)),
            port=int(port) if str(port).isdigit() else default_port,
            groups=frozenset(host.groups),
            settings=settings,
            file=host.where.file,
            line=host.where.line,
        ))
    return nodes, problems


def load_cluster(path: str | Path, *, check_files: bool = False, releases_dir: Path | None = None) -> Cluster:
    """Read and validate an inventory without touching any host."""
    path = Path(path)
    if not path.is_file():
        raise InventoryError([Problem(str(path), None, "", "no such inventory file",
                                      "pass the path of an Ansible YAML inventory")])
    inv = read_inventory(path)
    if inv.problems and not inv.hosts and not inv.groups.get("all", None):
        raise InventoryError(inv.problems)
    problems = list(inv.problems)
    settings, where, found = _settings(inv)
    problems += found
    default_port = settings.ssh.port if settings else 22
    nodes, found = _nodes(inv, default_port)
    problems += found
    problems += checks.groups_and_nodes(inv, nodes)
    if settings is not None and where is not None:
        try:
            release = matrix.load(settings.release, releases_dir)
        except MatrixError as exc:
            problems.append(Problem(where.file, where.child("release").line, "gpuboot.release",
                                    f"{settings.release!r}: {exc.message}", exc.hint))
        else:
            problems += checks.node_os(settings, release, where)
        problems += checks.addresses(settings, nodes, where)
        problems += checks.references(settings, nodes, where, inv, check_files=check_files)
        problems += checks.tenants(settings, where)
    if problems:
        raise InventoryError(problems)
    assert settings is not None
    return Cluster(inventory=str(path), settings=settings, nodes=tuple(nodes), source_files=tuple(inv.files))
