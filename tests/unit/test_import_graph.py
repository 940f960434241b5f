"""gpuboot's own modules import one another without a circle, counting the imports made inside
functions too (a lazy import hides a circle from Python, not from the design): the model is a
leaf the resolvers read, the CLI core is a module the sub-commands use, and the catalog does not
build what is built from it."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bootstrap" / "gpuboot"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The gpuboot modules a file imports, anywhere in it (a package counts as its __init__)."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module_name(path):
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    known = {module_name(f) for f in files}
    edges = {module_name(f): imports(f, known) for f in files}
    # A package's __init__ is not a module the design puts in a circle (it re-exports nothing here).
    return {m: {t for t in targets if not (t.count(".") < m.count(".") and m.startswith(t + "."))}
            for m, targets in edges.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_scan_finds_a_circle_and_the_imports_inside_functions():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges = graph()
    assert "gpuboot.gpu_plan" in edges["gpuboot.config.model"] or "gpuboot.config.model" in edges["gpuboot.gpu_plan"]
    assert len(edges) > 50


def test_gpubootss_modules_import_one_another_without_a_circle():
    found = circles(graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(group) for group in found)
