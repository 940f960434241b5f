"""One builder at a time per cache entry, across processes. Two test lanes, or two terminals,
that need the same build wait for the first to finish and then find it built, instead of
building it twice into the same files."""
from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = ".building.lock"


@contextmanager
def building(directory: Path, what: str, log: Callable[[str], None] = print) -> Iterator[None]:
    """Holds DIRECTORY's build lock (an flock, released when the process dies) for the block.
    The caller checks again inside the block whether the build is there."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / LOCK_FILE).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{what}: another process is building it; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(directory: Path, what: str, built: Callable[[], bool], build: Callable[[], object],
               log: Callable[[str], None] = print) -> None:
    """Runs BUILD unless BUILT() says its result is there, asking again under DIRECTORY's lock:
    a process that waited on another's build finds it made and builds nothing."""
    if built():
        return
    with building(directory, what, log):
        if not built():
            build()
