"""The TEST DOUBLES written in Go (modules under tests/doubles), built as static binaries the lab
puts into operand images. Cached by the module's files and the Go version, one builder at a time
(gpuboot_lab.locks), under ~/.cache/gpuboot/doubles/bin."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

from gpuboot_lab.locks import build_once

DOUBLES = Path(__file__).resolve().parents[1] / "doubles"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuboot" / "doubles"


def _env() -> dict[str, str]:
    return dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=mod",
                GOMODCACHE=str(CACHE / "gomodcache"), GOCACHE=str(CACHE / "gocache"))


# `replace <module> => ../dir`: a module of the doubles' tree that this one builds from source.
LOCAL_REPLACE = re.compile(r"^\s*(?:replace\s+)?\S+\s+=>\s+(\.\.?/\S+)\s*$", re.M)


def local_modules(module: Path) -> list[Path]:
    """`module` and every module of the tree it builds from source (its local replaces', and theirs)."""
    found, todo = [], [module.resolve()]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        todo += [(current / target).resolve() for target in LOCAL_REPLACE.findall((current / "go.mod").read_text())]
    return found


def source_key(module: Path) -> str:
    """What the binary is built from: the files of the module and of the local modules it
    replaces in (their tests left out), and the Go version."""
    hashed = hashlib.sha256()
    for root in local_modules(module):
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith("_test.go")):
            hashed.update(str(path.relative_to(DOUBLES)).encode() + b"\0" + path.read_bytes() + b"\0")
    go = subprocess.run(["go", "env", "GOVERSION"], env=_env(), capture_output=True, text=True, check=True)
    hashed.update(go.stdout.strip().encode())
    return hashed.hexdigest()[:16]


def build(module: str, name: str) -> Path:
    """The binary `name` built from tests/doubles/<module>."""
    source = DOUBLES / module
    binary = CACHE / "bin" / f"{module.replace('/', '-')}-{source_key(source)}" / name

    def compile_it() -> None:
        done = subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(binary), "."], cwd=source,
                              env=_env(), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"building the {module} double failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")

    build_once(binary.parent, f"the {module} double", binary.is_file, compile_it, log=lambda message: None)
    return binary
