"""The lab is its own package (bootstrap/gpuboot_lab), built on gpuboot's library: the
product never names it, and `gpuboot lab` reaches it through the gpuboot.commands entry point."""
from __future__ import annotations

import ast
from pathlib import Path

from gpuboot import matrix
from gpuboot.cli.main import run

PRODUCT = Path(__file__).resolve().parents[2] / "bootstrap" / "gpuboot"


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_product_never_imports_the_lab():
    offenders = {str(p.relative_to(PRODUCT)): sorted(m for m in imported_modules(p) if m.startswith("gpuboot_lab"))
                 for p in PRODUCT.rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}
    assert not (PRODUCT / "lab").exists()


def test_gpuboot_lab_is_registered_through_the_entry_point(capsys):
    assert run(["lab", "--help"]) == 0
    out = capsys.readouterr().out
    assert "kubernetes" in out and "mirror" in out and "molecule" in out


def test_lab_kubernetes_defaults_to_the_lab_inventorys_release(tmp_path):
    from gpuboot_lab.cli import _version
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  vars:\n    gpuboot: {cluster_name: lab, release: k8s-1.36, control_plane: {vip: 10.0.0.1}}\n"
                         "  children:\n    control_plane: {hosts: {cp1: {ansible_host: 10.0.0.11}}}\n")
    assert _version(None, str(inventory)) == matrix.load("k8s-1.36").kubernetes.version
    assert _version("v1.35.4", str(inventory)) == "v1.35.4"  # an explicit version wins
    assert _version(None, str(tmp_path / "absent.yml")) is None  # no lab inventory: the newest
