"""Public repositories' source trees on this machine: the lab builds from a tag of one where the
Go module proxy lacks what it needs (a vendored tree, a nested module)."""
from __future__ import annotations

from pathlib import Path

# Where `fetch` leaves a public repository's git directory on these machines.
SOURCE_ROOT = Path("/work/.mirror")


def source_git_dir(repository: str, root: Path = SOURCE_ROOT) -> Path | None:
    """The bare git directory of a public repository brought onto this machine, if any."""
    found = root / repository.replace("/", "+") / "repo"
    return found if (found / "HEAD").is_file() else None
