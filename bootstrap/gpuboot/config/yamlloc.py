"""Located lint of YAML inventories and vars files: what Ansible only warns about (a
duplicate key, a misspelt group key) or reports without a fix becomes a Problem with the
file, the line and the dotted path. Ansible itself resolves the inventory; this pass only
composes the node tree (libyaml's parser) and never builds the data."""
from __future__ import annotations

from pathlib import Path

import yaml

from gpuboot.errors import Problem, dotted

GROUP_KEYS = ("hosts", "vars", "children")


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's parser with the safe resolver's answers remembered: an inventory repeats
    the same scalars (counts, link types, booleans) thousands of times, and the resolver's
    regular expressions run in Python for each."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._resolved: dict = {}

    def resolve(self, kind, value, implicit):
        key = (kind, value, implicit)
        tag = self._resolved.get(key)
        if tag is None:
            tag = self._resolved[key] = super().resolve(kind, value, implicit)
        return tag


def read_utf8(path: Path) -> tuple[str | None, Problem | None]:
    """A file's text, or the located problem that keeps it from being read as UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return None, Problem(str(path), None, "", f"cannot read: {exc.strerror}", "check the file's permissions")
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return None, Problem(str(path), line, "", f"not UTF-8 text (byte {exc.start}: {data[exc.start]:#04x})",
                             "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def _compose(path: Path, keep: dict[str, yaml.Node] | None = None) -> tuple[yaml.Node | None, list[Problem]]:
    """The file's node tree; `keep` collects it (by path) for a later plain build."""
    name = str(path)
    text, problem = read_utf8(path)
    if problem is not None:
        return None, [problem]
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if keep is not None and node is not None:
            keep[name] = node
        return node, []
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        return None, [Problem(name, mark.line + 1 if mark else None, "", f"YAML syntax error: {exc.problem or exc}",
                              "check indentation and quoting on that line")]
    except yaml.YAMLError as exc:
        return None, [Problem(name, None, "", f"YAML error: {exc}", "fix the YAML")]
    finally:
        loader.dispose()


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _duplicates(node: yaml.Node, path: tuple, file: str, out: list[Problem]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # a complex key: Ansible's own read reports it
            key = key_node.value
            here = (*path, key)
            if key in seen:
                out.append(Problem(file, _line(key_node), dotted(*here),
                                   f"duplicate key (first defined on line {seen[key]}); YAML keeps only the last one",
                                   "remove or rename one of them"))
            seen[key] = _line(key_node)
            _duplicates(value_node, here, file, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _duplicates(item, (*path, index), file, out)


def lint(path: Path, keep: dict[str, yaml.Node] | None = None) -> list[Problem]:
    """A vars file: syntax and duplicate keys."""
    node, problems = _compose(path, keep)
    if node is not None:
        _duplicates(node, (), str(path), problems)
    return problems


def _group(node: yaml.Node, path: tuple, file: str, out: list[Problem], depth: int = 0) -> None:
    place = dotted(*path)
    if isinstance(node, yaml.ScalarNode) and node.value in ("", "~", "null"):
        return
    if not isinstance(node, yaml.MappingNode):
        out.append(Problem(file, _line(node), place, "a group must be a mapping with hosts, vars or children",
                           "indent its hosts under `hosts:`"))
        return
    for key_node, value_node in node.value:
        key = key_node.value
        here = dotted(place, key)
        empty = isinstance(value_node, yaml.ScalarNode) and value_node.value in ("", "~", "null")
        if key not in GROUP_KEYS:
            out.append(Problem(file, _line(key_node), here, f"unknown group key '{key}'",
                               "a group holds only hosts:, vars: and children:"))
        elif key == "hosts" and not empty and not isinstance(value_node, yaml.MappingNode):
            out.append(Problem(file, _line(key_node), here, "hosts must be a mapping of host name to its variables",
                               "write `cp01:` with its variables indented below, not a list"))
        elif key == "vars" and not empty and not isinstance(value_node, yaml.MappingNode):
            out.append(Problem(file, _line(key_node), here, "vars must be a mapping of name: value",
                               "write each variable as `name: value` under vars:"))
        elif key == "children" and not empty:
            if not isinstance(value_node, yaml.MappingNode):
                out.append(Problem(file, _line(key_node), here, "children must be a mapping of group names",
                                   "write each child group as `name:` under children:"))
            elif depth < 20:
                for child_key, child_node in value_node.value:
                    _group(child_node, (*path, "children", child_key.value), file, out, depth + 1)


def lint_inventory(path: Path, keep: dict[str, yaml.Node] | None = None) -> list[Problem]:
    """A YAML inventory: syntax, duplicate keys, and the shape Ansible's yaml plugin reads."""
    node, problems = _compose(path, keep)
    if node is None:
        return problems
    file = str(path)
    _duplicates(node, (), file, problems)
    if not isinstance(node, yaml.MappingNode):
        problems.append(Problem(file, _line(node), "", "an inventory must be a YAML mapping whose top key is `all:`",
                                "see inventories/sample/inventory.yml"))
        return problems
    for key_node, value_node in node.value:
        _group(value_node, (key_node.value,), file, problems)
    return problems


class NotPlain(Exception):
    """A node the plain build leaves to Ansible's own loader (a tag such as !vault or
    !unsafe, a set, a key that is not a scalar)."""


_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
_SCALARS = {f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "timestamp", "binary")}


def build(node: yaml.Node) -> object:
    """The data of a composed tree as YAML 1.1's safe constructor builds it (merge keys
    flattened, an alias the same object), without Ansible's per-value origin tags: the
    fast path for a large inventory that has nothing to report."""
    safe = yaml.constructor.SafeConstructor()
    memo: dict[int, object] = {}

    def one(item: yaml.Node) -> object:
        tag = item.tag
        if isinstance(item, yaml.ScalarNode):
            if tag == _STR:
                return item.value
            if tag in _SCALARS:
                return safe.construct_object(item, deep=True)
            raise NotPlain(tag)
        known = memo.get(id(item))
        if known is not None:
            return known
        if isinstance(item, yaml.SequenceNode) and tag == _SEQ:
            items: list = []
            memo[id(item)] = items
            items.extend(one(child) for child in item.value)
            return items
        if isinstance(item, yaml.MappingNode) and tag == _MAP:
            safe.flatten_mapping(item)
            mapping: dict = {}
            memo[id(item)] = mapping
            for key_node, value_node in item.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise NotPlain("a key that is not a scalar")
                mapping[one(key_node)] = one(value_node)
            return mapping
        raise NotPlain(tag)

    return one(node)
