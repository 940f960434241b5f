"""An inventory as Ansible itself reads it: hosts, groups, host ranges, INI or YAML,
group_vars/ and host_vars/ beside it, variables merged in Ansible's own precedence.

gpuboot adds only the location of each value: Ansible tags every value it loads with its
origin (file, line), and a short scan of the inventory file finds where each host is
written. This is the one module of gpuboot.config that imports Ansible."""
from __future__ import annotations

import difflib
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from gpuboot.config import yamlloc
from gpuboot.errors import Problem, dotted

# The inventory plugins an operator's file can be written for; `auto` (plugin configs)
# is left out because it parses every YAML inventory a second time.
ENABLED_PLUGINS = ("yaml", "ini", "toml")
INVENTORY_ONLY = ("all_inventory", "groups_inventory", "all_plugins_inventory", "groups_plugins_inventory")
# gpuboot's dict variables. Ansible replaces a dict variable whole (hash_behaviour=replace), so
# where one is split over several vars files of one group or host, or (gpuboot_node) over a
# host's groups and its own vars, the later definition would silently drop the earlier one's
# keys: that is refused, naming both places. (gpuboot itself is refused on any group but all,
# and in two places of all, by the loader.)
SPLIT_CHECKED = ("gpuboot", "gpuboot_node")
HOST_SPLIT_CHECKED = ("gpuboot_node",)


@cache
def _ansible() -> SimpleNamespace:
    """Import Ansible lazily (about 0.5 s: commands that read no inventory skip it), and only here."""
    from ansible import constants
    from ansible._internal._datatag._tags import Origin
    from ansible.errors import AnsibleError
    from ansible.inventory.helpers import sort_groups
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.inventory import detect_range, expand_hostname_range
    from ansible.plugins.loader import inventory_loader, vars_loader
    from ansible.utils.vars import combine_vars
    from ansible.vars.plugins import get_vars_from_inventory_sources
    return SimpleNamespace(
        constants=constants, Origin=Origin, AnsibleError=AnsibleError, sort_groups=sort_groups,
        InventoryManager=InventoryManager, DataLoader=DataLoader, detect_range=detect_range,
        expand_hostname_range=expand_hostname_range, inventory_loader=inventory_loader, vars_loader=vars_loader,
        combine_vars=combine_vars, get_vars_from_inventory_sources=get_vars_from_inventory_sources)


@dataclass
class Where:
    """A value read by Ansible plus a path into it; file and line come from Ansible's
    origin tags, from the deepest part of the path that exists."""

    root: Any
    path: tuple = ()
    default_file: str = ""
    default_line: int | None = None
    # The variable's name as Ansible read it: its origin is the line the variable starts on.
    name: Any = None

    def _origin(self):
        origin_type = _ansible().Origin
        found = origin_type.get_tag(self.name) or origin_type.get_tag(self.root)
        value = self.root
        for key in self.path:
            if isinstance(value, dict):
                match = next((k for k in value if k == key), None)
                if match is None:
                    break
                found = origin_type.get_tag(match) or origin_type.get_tag(value[match]) or found
                value = value[match]
            elif isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
                value = value[key]
                found = origin_type.get_tag(value) or found
            else:
                break
        return found

    @property
    def file(self) -> str:
        origin = self._origin()
        return origin.path if origin is not None and origin.path else self.default_file

    @property
    def line(self) -> int | None:
        origin = self._origin()
        if origin is not None and origin.path:
            return origin.line_num
        return self.default_line

    def child(self, *keys: Any) -> Where:
        return Where(self.root, (*self.path, *keys), self.default_file, self.default_line, self.name)


@dataclass
class InventoryHost:
    name: str
    groups: tuple[str, ...]
    vars: dict[str, Any]
    file: str
    line: int | None

    def where(self, var: str) -> Where:
        if var not in self.vars:
            return Where(None, (), self.file, self.line)
        return _defined(self.vars, var, self.file, self.line)


@dataclass
class AnsibleInventory:
    path: Path
    hosts: dict[str, InventoryHost] = field(default_factory=dict)
    group_children: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # (variable, group or host name, Where) for every definition below the group `all`
    scoped_definitions: list[tuple[str, str, Where]] = field(default_factory=list)
    all_definitions: dict[str, list[Where]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    manager: Any = None
    # Whether values carry Ansible's origin tags (file and line for every Where).
    located: bool = True

    def ancestors(self, group: str) -> set[str]:
        found: set[str] = set()
        stack = [group]
        while stack:
            child = stack.pop()
            for parent, children in self.group_children.items():
                if child in children and parent not in found:
                    found.add(parent)
                    stack.append(parent)
        return found

    def group_line(self, group: str) -> int | None:
        """Where the group is written in the inventory file: `[group]` or `[group:children]`
        in INI, its `group:` key in YAML."""
        try:
            text = self.path.read_text(errors="replace")
        except OSError:
            return None
        if self.path.suffix in (".yml", ".yaml"):
            pattern = re.compile(rf"^\s*['\"]?{re.escape(group)}['\"]?\s*:\s*(#.*)?$")
        else:
            pattern = re.compile(rf"^\[{re.escape(group)}(:children|:vars)?\]")
        return next((n for n, line in enumerate(text.splitlines(), 1) if pattern.match(line)), None)

    def hosts_matching(self, pattern: str) -> list[str]:
        """Ansible's own host patterns (groups, `a:b`, `a:&b`, `a:!b`, `g[0]`, `g[1:]`)."""
        if self.manager is None:
            return []
        with _quiet_ansible():  # a group the inventory does not have matches no host, silently
            return [h.name for h in self.manager.get_hosts(pattern=pattern, ignore_restrictions=True)]


@contextmanager
def _quiet_ansible():
    """Ansible prints its inventory warnings (duplicate keys, unknown group keys) to the
    terminal; the lint pass reports each of them as a located problem instead."""
    from ansible.utils.display import Display
    display = Display()
    saved = display.__dict__.get("warning")
    display.warning = lambda *args, **kwargs: None
    try:
        yield
    finally:
        if saved is None:
            del display.warning
        else:
            display.warning = saved


def _fast_loader(nodes: dict[str, Any] | None = None):
    """Ansible's DataLoader without the defensive deep copy of a fresh parse (it doubles
    the cost of a large inventory; the plugin owns the result anyway). With `nodes` (the
    trees the lint pass composed, by path), a YAML file among them is built plainly from its
    tree instead of parsed again with an origin tag on every value: four times faster on a
    large inventory, for a read whose values need no location (nothing to report)."""
    class FastLoader(_ansible().DataLoader):
        def load_from_file(self, file_name, cache="all", unsafe=False, json_only=False, trusted_as_template=False):
            node = (nodes or {}).get(str(file_name))
            if node is not None and not json_only:
                try:
                    return yamlloc.build(node)
                except (yamlloc.NotPlain, TypeError, yaml.YAMLError):
                    pass  # Ansible's own loader reads it, tags and all
            return super().load_from_file(file_name, cache=cache, unsafe=unsafe or cache == "none",
                                          json_only=json_only, trusted_as_template=trusted_as_template)
    return FastLoader()


# Every key on a YAML line (block or flow style): `cp01:`, `{cp01: {...}, cp02: ...}`.
_KEYS_YAML = re.compile(r"(?:^|[{,\s])['\"]?([^\s'\"{},:#]+)['\"]?\s*:(?=\s|$|[{,])")
_HOST_LINE_INI = re.compile(r"^\s*([^\s#;\[=][^\s=]*)(?:\s|$)")


def _host_lines(path: Path, names: set[str], a: SimpleNamespace) -> dict[str, int]:
    """Where each host is first written in the inventory file (ranges expanded)."""
    lines: dict[str, int] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return lines
    yaml_like = path.suffix in (".yml", ".yaml", ".json")
    for number, line in enumerate(text.splitlines(), start=1):
        if yaml_like:
            tokens = _KEYS_YAML.findall(line.split(" #", 1)[0])
        else:
            match = _HOST_LINE_INI.match(line)
            tokens = [match.group(1)] if match else []
        for token in tokens:
            candidates = [token]
            if "[" in token and a.detect_range(token):
                try:
                    candidates = a.expand_hostname_range(token)
                except Exception:  # a malformed range is Ansible's error to report
                    candidates = []
            for name in candidates:
                if name in names and name not in lines:
                    lines[name] = number
    return lines


def _diagnose(path: Path, loader, a: SimpleNamespace) -> list[Problem]:
    """The source parsed with no plugin: ask each one why, and report the likeliest."""
    from ansible.inventory.data import InventoryData
    reasons = []
    for name in ENABLED_PLUGINS:
        plugin = a.inventory_loader.get(name)
        try:
            if not plugin.verify_file(str(path)):
                continue
            plugin.parse(InventoryData(), loader, str(path), cache=False)
        except Exception as exc:  # every plugin's failure is a reason to show
            origin = a.Origin.get_tag(getattr(exc, "obj", None))
            line = origin.line_num if origin is not None else None
            reasons.append((name, str(getattr(exc, "message", exc)).splitlines()[0], line))
    yaml_like = path.suffix in (".yml", ".yaml")
    reasons.sort(key=lambda r: (r[0] != ("yaml" if yaml_like else "ini")))
    if not reasons:
        return [Problem(str(path), None, "", "Ansible cannot read this file as an inventory",
                        "write a YAML inventory (all: children: ...) or an INI one ([control_plane] ...)")]
    plugin, message, line = reasons[0]
    return [Problem(str(path), line, "", f"not a valid {plugin} inventory: {message}",
                    "see inventories/sample/ for the shape Ansible expects")]


def _vars_files(path: Path) -> list[Path]:
    """The group_vars/ and host_vars/ files Ansible reads beside the inventory."""
    found: list[Path] = []
    for kind in ("group_vars", "host_vars"):
        base = path.parent / kind
        if base.is_dir():
            found += [vf for vf in sorted(base.rglob("*")) if vf.is_file() and vf.suffix in (".yml", ".yaml", ".json", "")]
    return found


def _split_over_files(path: Path) -> list[Problem]:
    """One of gpuboot's dict variables in two files of one group or host (group_vars/all.yml and
    group_vars/all/*.yml, or two files in group_vars/all/): Ansible loads them in name order
    and the later replaces the earlier whole."""
    owners: dict[tuple[str, str], list[Path]] = {}
    for vf in _vars_files(path):
        relative = vf.relative_to(path.parent).parts
        owners.setdefault((relative[0], Path(relative[1]).stem if len(relative) == 2 else relative[1]), []).append(vf)
    problems = []
    # Only a group or host with two or more files can split a variable over them (a 2,000-host
    # inventory with one host_vars file each reads no file twice).
    for files in (f for f in owners.values() if len(f) > 1):
        loaded = []
        # Ansible's order: the group's own file, then its folder's files by name; the last wins.
        for vf in sorted(files, key=lambda f: (len(f.relative_to(path.parent).parts) > 2, str(f))):
            try:
                data = yaml.safe_load(vf.read_text())
            except yaml.YAMLError:
                continue  # reported by the lint
            if isinstance(data, dict):
                loaded.append((vf, data))
        for var in SPLIT_CHECKED:
            defining = [(vf, data[var]) for vf, data in loaded if var in data]
            later, final = defining[-1] if defining else (None, None)
            for earlier, value in defining[:-1]:  # the last file's dict is the one Ansible keeps
                if lost := _lost_keys(value, final):
                    problems.append(Problem(
                        str(earlier.absolute()), _top_line(earlier, var), var,
                        f"{var} is split over {earlier.relative_to(path.parent)} and {later.relative_to(path.parent)}: Ansible loads "
                        f"them in turn and replaces the whole dict, so {', '.join(lost)} set here would be dropped",
                        f"keep {var} in one file"))
    return problems


def _top_line(file: Path, var: str) -> int | None:
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if line.startswith(f"{var}:"):
            return number
    return None


def _vars_file_problems(path: Path, keep: dict[str, Any] | None = None) -> tuple[list[Problem], list[str]]:
    """Duplicate keys and syntax errors in group_vars/ and host_vars/ YAML (Ansible only warns)."""
    problems: list[Problem] = []
    files: list[str] = []
    for vf in _vars_files(path):
        files.append(str(vf))
        if vf.suffix != ".json":
            problems += yamlloc.lint(vf, keep)
    return problems, files


def _orphan_vars_files(path: Path, groups: set[str], hosts: set[str]) -> list[Problem]:
    """Ansible silently ignores group_vars/<name> for a group that does not exist: usually a typo."""
    problems = []
    for kind, known in (("group_vars", groups), ("host_vars", hosts)):
        base = path.parent / kind
        if not base.is_dir():
            continue
        entries = [e for e in sorted(base.iterdir()) if not e.name.startswith(".")
                   and not (e.is_file() and e.suffix not in (".yml", ".yaml", ".json", ""))]
        stems = {e.name if e.is_dir() else e.stem for e in entries}
        for entry in entries:
            stem = entry.name if entry.is_dir() else entry.stem
            if stem not in known:
                # A rename only helps towards a name that has no vars file of its own yet.
                close = difflib.get_close_matches(stem, sorted(known - stems), n=1)
                what = "group" if kind == "group_vars" else "host"
                fix = (f"rename it to {close[0]!r}" if close else
                       f"delete it if the {what} is gone, or add '{stem}' to the inventory")
                problems.append(Problem(str(entry), None, "",
                                        f"{kind} file for '{stem}', which the inventory does not define; Ansible ignores it",
                                        fix))
    return problems


def _defined(layer: dict, var: Any, file: str, line: int | None = None) -> Where:
    name = next(k for k in layer if k == var)
    return Where(layer[var], (), file, line, name)


def read_inventory(path: Path, *, located: bool = True) -> AnsibleInventory:
    """located=False skips Ansible's origin tags (every Where then answers the inventory
    file and no line): for a first read whose problems, if any, are read again located."""
    path = Path(path)
    inv = AnsibleInventory(path=path, files=[str(path)], located=located)
    # Text Ansible cannot decode is escaped with a warning, or fails deep in a vars plugin:
    # every file is checked first, and nothing is read further while one is not UTF-8.
    inv.problems += [problem for f in (path, *_vars_files(path)) if (problem := yamlloc.read_utf8(f)[1])]
    if inv.problems:
        return inv
    nodes: dict[str, Any] | None = None if located else {}
    if path.suffix in (".yml", ".yaml"):
        inv.problems += yamlloc.lint_inventory(path, nodes)
        if any(p.message.startswith("YAML syntax error") for p in inv.problems):
            return inv
    vars_problems, vars_files = _vars_file_problems(path, nodes)
    inv.problems += vars_problems + _split_over_files(path)
    inv.files += vars_files
    a = _ansible()
    loader = _fast_loader(nodes)
    previous = a.constants.INVENTORY_ENABLED
    a.constants.INVENTORY_ENABLED = list(ENABLED_PLUGINS)
    try:
        with _quiet_ansible():
            manager = a.InventoryManager(loader=loader, sources=[str(path)])
    except a.AnsibleError as exc:
        inv.problems.append(Problem(str(path), None, "", f"Ansible cannot read the inventory: {exc.message}",
                                    "fix the file as the message says"))
        return inv
    finally:
        a.constants.INVENTORY_ENABLED = previous
    inv.manager = manager
    data = manager._inventory  # noqa: SLF001  (the parsed InventoryData; Ansible has no public getter)
    if not data.processed_sources:
        inv.problems += _diagnose(path, loader, a)
        return inv
    inv.problems += _orphan_vars_files(path, set(data.groups), set(data.hosts))
    _resolve_variables(inv, data, loader, a)
    return inv


def _resolve_variables(inv: AnsibleInventory, data, loader, a: SimpleNamespace) -> None:
    """Each host's variables in Ansible's precedence (inventory stages of VARIABLE_PRECEDENCE,
    then the host's own), each group's and host's computed once, and where each is defined."""
    # Absolute: Ansible's vars plugins look for group_vars/ and host_vars/ beside the source, and an
    # operator runs gpuboot from the inventory's own folder with a relative path.
    file = str(inv.path.absolute())
    # The vars plugins (host_group_vars reads group_vars/ and host_vars/) as the enabled list
    # names them; stage "all" is what ansible-inventory and a play both see.
    list(a.vars_loader.all(class_only=True))
    for plugin_name in a.constants.VARIABLE_PLUGINS_ENABLED:
        a.vars_loader.get(plugin_name)

    def plugin_vars(entity) -> dict:
        return a.get_vars_from_inventory_sources(loader, [file], [entity], "all")

    groups = data.groups
    group_own = {name: g.get_vars() for name, g in groups.items()}
    group_plugin = {name: plugin_vars(g) for name, g in groups.items()}
    inv.group_children = {name: tuple(c.name for c in g.child_groups) for name, g in groups.items()}
    for var in set(group_own["all"]) | set(group_plugin["all"]):
        inv.all_definitions[var] = [_defined(d, var, file) for d in (group_own["all"], group_plugin["all"]) if var in d]
    for name in groups:
        if name not in ("all", "ungrouped"):
            for layer in (group_own[name], group_plugin[name]):
                inv.scoped_definitions += [(str(var), name, _defined(layer, var, file)) for var in layer]

    precedence = [e for e in a.constants.VARIABLE_PRECEDENCE if e in INVENTORY_ONLY]
    lines = _host_lines(inv.path, set(data.hosts), a)
    dropped: list[tuple[str, Where, Where, tuple[str, ...]]] = []
    for name, host in data.hosts.items():
        member_of = a.sort_groups([g for g in host.get_groups() if g.name != "all"])
        layers = {"all_inventory": [group_own["all"]], "all_plugins_inventory": [group_plugin["all"]],
                  "groups_inventory": [group_own[g.name] for g in member_of],
                  "groups_plugins_inventory": [group_plugin[g.name] for g in member_of]}
        own = {k: v for k, v in host.get_vars().items() if k not in ("inventory_file", "inventory_dir")}
        own_plugin = plugin_vars(host)
        merged: dict[str, Any] = {}
        parts = [*(p for entry in precedence for p in layers[entry]), own, own_plugin]
        for part in parts:
            merged = a.combine_vars(merged, part)
        dropped.extend(_dropped_settings(name, parts, merged, file))
        for layer in (own, own_plugin):
            inv.scoped_definitions += [(str(var), name, _defined(layer, var, file, lines.get(name))) for var in layer]
        inv.hosts[name] = InventoryHost(name=name, groups=tuple(g.name for g in member_of) + ("all",),
                                        vars=merged, file=file, line=lines.get(name))
    inv.problems += _split_problems(dropped)


def _lost_keys(earlier: Any, final: Any, path: tuple = ()) -> list[str]:
    """The dotted keys of `earlier` that `final` no longer has (dicts compared all the way down)."""
    if not isinstance(earlier, dict) or not isinstance(final, dict):
        return []
    lost = []
    for key, value in earlier.items():
        if key not in final:
            lost.append(dotted(*path, key))
        else:
            lost += _lost_keys(value, final[key], (*path, key))
    return lost


def _dropped_settings(host: str, parts: list[dict], merged: dict, file: str) -> list[tuple[str, Where, Where, tuple[str, ...]]]:
    """(host, the earlier definition, the one that replaced it, the keys lost) for each of
    gpuboot's dict variables that more than one of the host's layers defines."""
    found = []
    for var in HOST_SPLIT_CHECKED:
        defining = [part for part in parts if var in part]
        if len(defining) < 2:
            continue
        winner = _defined(defining[-1], var, file)
        for part in defining[:-1]:
            if part[var] is merged[var]:
                continue
            lost = _lost_keys(part[var], merged[var])
            if lost:
                found.append((host, _defined(part, var, file), winner, tuple(lost)))
    return found


def _split_problems(dropped: list[tuple[str, Where, Where, tuple[str, ...]]]) -> list[Problem]:
    """One problem per pair of places, naming the hosts it touches."""
    by_place: dict[tuple, list[str]] = {}
    for host, earlier, winner, lost in dropped:
        key = (earlier.file, earlier.line, winner.file, winner.line, str(earlier.name), lost)
        by_place.setdefault(key, []).append(host)
    problems = []
    for (file, line, winner_file, winner_line, var, lost), hosts in sorted(by_place.items(), key=str):
        named = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
        there = f"{winner_file}:{winner_line}" if winner_line else winner_file
        problems.append(Problem(
            file, line, var,
            f"{var} is split: for {named} it is set here and again in {there}, and Ansible replaces the whole "
            f"dict, so {', '.join(lost)} set here would be dropped",
            f"set {var} for these hosts in one place, or repeat {', '.join(lost)} in {there}"))
    return problems
