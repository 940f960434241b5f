"""Writing files on the control machine."""
from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, data: bytes | str) -> None:
    """Write a file only its owner reads (created 0600, never world-readable for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data.encode() if isinstance(data, str) else data)
