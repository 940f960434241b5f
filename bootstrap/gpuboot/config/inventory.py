"""Reads an Ansible YAML inventory (plus group_vars/ and host_vars/ beside it) into
hosts, groups and variables, remembering where each thing was written."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuboot.config.yamlloc import LocatedDoc, load_located
from gpuboot.errors import Problem

GROUP_KEYS = {"hosts", "vars", "children"}


@dataclass
class Where:
    doc: LocatedDoc
    path: tuple

    @property
    def file(self) -> str:
        return self.doc.file

    @property
    def line(self) -> int | None:
        return self.doc.line_of(self.path)

    def child(self, *keys: Any) -> "Where":
        return Where(self.doc, (*self.path, *keys))


@dataclass
class RawHost:
    name: str
    where: Where
    vars: dict[str, Any] = field(default_factory=dict)
    var_where: dict[str, Where] = field(default_factory=dict)
    groups: set[str] = field(default_factory=set)


@dataclass
class RawGroup:
    name: str
    hosts: set[str] = field(default_factory=set)
    children: set[str] = field(default_factory=set)
    vars: dict[str, Any] = field(default_factory=dict)
    var_where: dict[str, Where] = field(default_factory=dict)


@dataclass
class RawInventory:
    path: Path
    hosts: dict[str, RawHost] = field(default_factory=dict)
    groups: dict[str, RawGroup] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    # (variable, earlier definition, later definition that replaced it at the same level)
    shadowed: list[tuple[str, Where, Where]] = field(default_factory=list)

    def group_members(self, group: str) -> set[str]:
        """Hosts in a group or in any of its descendants."""
        seen: set[str] = set()
        members: set[str] = set()
        stack = [group]
        while stack:
            g = stack.pop()
            if g in seen or g not in self.groups:
                continue
            seen.add(g)
            members |= self.groups[g].hosts
            stack.extend(self.groups[g].children)
        return members

    def ancestors(self, group: str) -> set[str]:
        parents = {g.name for g in self.groups.values() if group in g.children}
        result = set(parents)
        for p in parents:
            result |= self.ancestors(p)
        return result

    def var_sources(self, name: str) -> list[tuple[Any, Where]]:
        """Every place a variable is defined, at group or host level."""
        found = [(g.vars[name], g.var_where[name]) for g in self.groups.values() if name in g.vars]
        found += [(h.vars[name], h.var_where[name]) for h in self.hosts.values() if name in h.vars]
        found += [(None, old) for key, old, _ in self.shadowed if key == name]
        return found


def _add_vars(target_vars: dict, target_where: dict, data: Any, where: Where, inv: RawInventory) -> None:
    if data is None:
        return
    if not isinstance(data, dict):
        inv.problems.append(Problem(where.file, where.line, ".".join(map(str, where.path)),
                                    "vars must be a mapping of name: value"))
        return
    for key, value in data.items():
        if key in target_where:
            inv.shadowed.append((key, target_where[key], where.child(key)))
        target_vars[key] = value
        target_where[key] = where.child(key)


def _parse_group(name: str, body: Any, where: Where, inv: RawInventory, depth: int = 0) -> None:
    group = inv.groups.setdefault(name, RawGroup(name))
    if body is None:
        return
    dotted = ".".join(map(str, where.path))
    if not isinstance(body, dict):
        inv.problems.append(Problem(where.file, where.line, dotted,
                                    "a group must be a mapping with hosts, vars or children",
                                    "indent its hosts under `hosts:`"))
        return
    for key in body:
        if key not in GROUP_KEYS:
            inv.problems.append(Problem(where.file, where.child(key).line, f"{dotted}.{key}",
                                        f"unknown group key '{key}'",
                                        "a group holds only hosts:, vars: and children:"))
    hosts = body.get("hosts") or {}
    if not isinstance(hosts, dict):
        inv.problems.append(Problem(where.file, where.child("hosts").line, f"{dotted}.hosts",
                                    "hosts must be a mapping of host name to its variables",
                                    "write `cp01:` with its variables indented below, not a list"))
        hosts = {}
    for host_name, host_vars in hosts.items():
        host_name = str(host_name)
        hwhere = where.child("hosts", host_name)
        host = inv.hosts.get(host_name)
        if host is None:
            host = inv.hosts[host_name] = RawHost(host_name, hwhere)
        group.hosts.add(host_name)
        _add_vars(host.vars, host.var_where, host_vars, hwhere, inv)
    _add_vars(group.vars, group.var_where, body.get("vars"), where.child("vars"), inv)
    children = body.get("children") or {}
    if not isinstance(children, dict):
        inv.problems.append(Problem(where.file, where.child("children").line, f"{dotted}.children",
                                    "children must be a mapping of group names"))
        children = {}
    if depth > 20:
        return
    for child_name, child_body in children.items():
        group.children.add(str(child_name))
        _parse_group(str(child_name), child_body, where.child("children", child_name), inv, depth + 1)


def _vars_files(base: Path, name: str) -> list[Path]:
    """group_vars/<name>.yml, .yaml, bare <name>, or every YAML file in group_vars/<name>/."""
    found = [base / f"{name}{ext}" for ext in (".yml", ".yaml", "") if (base / f"{name}{ext}").is_file()]
    directory = base / name
    if directory.is_dir():
        found += sorted(p for p in directory.rglob("*") if p.suffix in (".yml", ".yaml") and p.is_file())
    return found


def _display(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root.parent)) if root.parent != Path(".") else str(path)
    except ValueError:
        return str(path)


def read_inventory(path: Path) -> RawInventory:
    inv = RawInventory(path)
    display_root = path.parent
    doc = load_located(path, display=str(path))
    inv.files.append(str(path))
    inv.problems += doc.problems
    if doc.problems:
        return inv
    if not isinstance(doc.data, dict):
        inv.problems.append(Problem(str(path), doc.line_of(()), "",
                                    "an inventory must be a YAML mapping whose top key is `all:`",
                                    "see inventories/sample/inventory.yml"))
        return inv
    for group_name, body in doc.data.items():
        _parse_group(str(group_name), body, Where(doc, (group_name,)), inv)
    inv.groups.setdefault("all", RawGroup("all"))
    # Ansible puts every top-level group under `all`.
    for group_name in doc.data:
        if group_name != "all":
            inv.groups["all"].children.add(str(group_name))

    for kind, table in (("group_vars", inv.groups), ("host_vars", inv.hosts)):
        base = display_root / kind
        if not base.is_dir():
            continue
        for name, target in table.items():
            for vf in _vars_files(base, name):
                vdoc = load_located(vf, display=str(vf))
                inv.files.append(str(vf))
                inv.problems += vdoc.problems
                _add_vars(target.vars, target.var_where, vdoc.data, Where(vdoc, ()), inv)
        # Files naming a group or host that does not exist are usually typos.
        known = set(table)
        for entry in sorted(base.iterdir()):
            stem = entry.stem if entry.is_file() else entry.name
            if (entry.is_dir() or entry.suffix in (".yml", ".yaml", "")) and stem not in known:
                inv.problems.append(Problem(str(entry), None, "",
                                            f"{kind} file for '{stem}', which the inventory does not define",
                                            f"rename it to an existing {'group' if kind == 'group_vars' else 'host'}"))

    for gname in inv.groups:
        for hname in inv.group_members(gname):
            inv.hosts[hname].groups.add(gname)
    for host in inv.hosts.values():
        host.groups.add("all")
    return inv
