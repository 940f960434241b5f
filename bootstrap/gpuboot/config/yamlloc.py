"""YAML loading that remembers the line of every key, so errors can point at it."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuboot.errors import Problem

Path_ = tuple  # a path into the document: keys and list indexes


class VaultValue(str):
    """An Ansible Vault ciphertext found in a file; never decrypted by gpuboot."""


class _Loader(yaml.SafeLoader):
    pass


def _vault(loader: yaml.SafeLoader, node: yaml.Node) -> VaultValue:
    return VaultValue(loader.construct_scalar(node))  # type: ignore[arg-type]


def _unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))  # type: ignore[arg-type]


_Loader.add_constructor("!vault", _vault)
_Loader.add_constructor("!unsafe", _unsafe)


@dataclass
class LocatedDoc:
    """A parsed YAML file plus the line of each key path in it."""

    file: str
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def line_of(self, path: Path_) -> int | None:
        """The line of `path`, or of its nearest ancestor that exists in the file."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), None)


def _walk(node: yaml.Node, path: Path_, doc: LocatedDoc) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                dotted = ".".join(str(p) for p in (*path, key))
                doc.problems.append(Problem(
                    doc.file, line, dotted,
                    f"duplicate key (first defined on line {seen[key]}); YAML keeps only the last one",
                    "remove or rename one of them",
                ))
            seen[key] = line
            doc.lines[(*path, key)] = line
            _walk(value_node, (*path, key), doc)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            doc.lines[(*path, index)] = item.start_mark.line + 1
            _walk(item, (*path, index), doc)


def load_located(path: Path, display: str | None = None) -> LocatedDoc:
    """Parse one YAML file. Syntax errors become a located Problem, not an exception."""
    name = display or str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        return LocatedDoc(name, None, problems=[Problem(name, None, "", f"cannot read: {exc.strerror}")])
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return LocatedDoc(name, None)
        doc = LocatedDoc(name, None, {(): node.start_mark.line + 1})
        _walk(node, (), doc)
        doc.data = loader.construct_document(node)
        return doc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        return LocatedDoc(name, None, problems=[Problem(
            name, line, "", f"YAML syntax error: {exc.problem or exc}",
            "check indentation and quoting on that line",
        )])
    except yaml.YAMLError as exc:
        return LocatedDoc(name, None, problems=[Problem(name, None, "", f"YAML error: {exc}")])
    finally:
        loader.dispose()
