"""Two processes that need the same lab build (two test lanes, two terminals) build it once: the
second waits on the cache entry's lock, says so, and then finds the first one's result."""
from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from gpuboot_lab.locks import build_once, building


def _build_once(directory: str, said: str) -> None:
    out = Path(directory) / "artifact"
    messages: list[str] = []

    def build() -> None:
        time.sleep(0.5)  # a build that takes a while
        with (Path(directory) / "builds").open("a") as count:
            count.write("built\n")
        out.write_text("done")

    build_once(Path(directory), "the artifact", out.is_file, build, messages.append)
    Path(said).write_text("\n".join(messages))


def test_the_second_builder_waits_and_finds_the_first_one_s_build(tmp_path):
    context = multiprocessing.get_context("fork")
    saids = [tmp_path / f"said-{i}" for i in range(2)]
    first = context.Process(target=_build_once, args=(str(tmp_path), str(saids[0])))
    first.start()
    time.sleep(0.1)  # the first holds the lock
    second = context.Process(target=_build_once, args=(str(tmp_path), str(saids[1])))
    second.start()
    first.join(10)
    second.join(10)
    assert first.exitcode == 0 and second.exitcode == 0
    assert (tmp_path / "builds").read_text() == "built\n"
    assert saids[1].read_text() == "the artifact: another process is building it; waiting for it"
    assert saids[0].read_text() == ""


def test_a_lock_held_by_a_dead_process_is_free(tmp_path):
    context = multiprocessing.get_context("fork")
    dying = context.Process(target=_die_holding, args=(str(tmp_path),))
    dying.start()
    dying.join(10)
    assert dying.exitcode == 9
    messages: list[str] = []
    with building(tmp_path, "the artifact", messages.append):
        pass
    assert messages == []


def _die_holding(directory: str) -> None:
    import os
    with building(Path(directory), "the artifact", lambda m: None):
        os._exit(9)


def test_a_build_already_there_takes_no_lock(tmp_path):
    (tmp_path / "artifact").write_text("done")
    build_once(tmp_path / "entry", "the artifact", (tmp_path / "artifact").is_file,
               lambda: (_ for _ in ()).throw(AssertionError("built again")))
    assert not (tmp_path / "entry").exists()  # not even the lock's folder
