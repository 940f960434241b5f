"""The lab is its own package (bootstrap/lab/gpuboot_lab, the distribution gpuboot-lab), built on gpuboot's library: the
product never names it, and `gpuboot lab` reaches it through the gpuboot.commands entry point."""
from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
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



def _wheel(source: Path, out: Path) -> tuple[set[str], str]:
    """The files of the wheel pip builds from `source` (no network, the locked backend), and
    its entry points."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(next(out.glob("*.whl"))) as wheel:
        names = set(wheel.namelist())
        points = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        return names, wheel.read(points).decode() if points else ""


def test_the_product_and_the_lab_are_two_distributions(tmp_path):
    """The product's wheel carries no lab code and registers no lab command; the lab's wheel
    carries the lab, its data files included, and registers `gpuboot lab` through the entry point."""
    root = PRODUCT.parents[1]
    product, product_points = _wheel(root, tmp_path / "product")
    assert "gpuboot/cli/main.py" in product and any(n.startswith("gpuboot/_content/roles/") for n in product)
    assert not any(n.startswith("gpuboot_lab/") for n in product)
    assert "gpuboot.commands" not in product_points

    lab, lab_points = _wheel(root / "bootstrap" / "lab", tmp_path / "lab")
    assert {"gpuboot_lab/cli.py", "gpuboot_lab/go/pause/main.go"} <= lab
    assert not any(n.startswith("gpuboot/") for n in lab)
    assert "[gpuboot.commands]" in lab_points and "lab = gpuboot_lab.cli:lab" in lab_points
