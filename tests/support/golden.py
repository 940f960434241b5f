"""Golden copies of rendered files: compared file by file; GPUBOOT_UPDATE_GOLDEN=1 rewrites
the copy from the render after a reviewed change."""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def matches_golden(rendered: Path, golden: Path) -> dict[str, str]:
    """Assert the rendered tree equals the golden one; return the rendered files."""
    if os.environ.get("GPUBOOT_UPDATE_GOLDEN"):
        shutil.rmtree(golden, ignore_errors=True)
        shutil.copytree(rendered, golden)
    got, want = tree(rendered), tree(golden)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], f"{golden.name}/{name} differs from the golden copy"
    return got
