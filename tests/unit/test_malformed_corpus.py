"""Every inventory under tests/corpus/malformed fails validation with its located error,
before any host is touched (load_cluster never connects anywhere)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuboot.config.loader import load_cluster
from gpuboot.errors import InventoryError

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "malformed"
CASES = sorted(CORPUS.glob("*.yml"))


def expectation(path: Path) -> tuple[str, str, int | None]:
    text = path.read_text()
    want_path = re.search(r"^# expect-path: ?(.*)$", text, re.M).group(1).strip()
    want_message = re.search(r"^# expect-message: (.*)$", text, re.M).group(1).strip()
    marker = [i for i, line in enumerate(text.splitlines(), start=1) if "# <- error" in line]
    return want_path, want_message, marker[0] if marker else None


def test_corpus_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_malformed_inventory_fails_with_located_error(case: Path):
    want_path, want_message, want_line = expectation(case)
    with pytest.raises(InventoryError) as info:
        load_cluster(case)
    problems = info.value.problems
    matching = [p for p in problems if want_message in p.message or (p.fix and want_message in p.fix)]
    assert matching, f"no problem says {want_message!r}; got:\n" + "\n".join(map(str, problems))
    located = [p for p in matching if p.path == want_path]
    assert located, f"{want_message!r} is reported at {[p.path for p in matching]}, want {want_path!r}"
    problem = located[0]
    assert problem.file.endswith(case.name)
    if want_line is not None:
        assert problem.line == want_line, f"{problem} points at line {problem.line}, want {want_line}"
    # The rendered message names the file, the line and the field.
    rendered = str(problem)
    assert rendered.startswith(f"{problem.file}:{problem.line}" if problem.line else problem.file)
    assert problem.fix, f"{problem} offers no fix"
