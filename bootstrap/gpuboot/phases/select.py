"""Picks the phases a run executes from --from/--to/--only/--skip."""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from gpuboot.errors import UsageError
from gpuboot.phases.catalog import Phase


@dataclass(frozen=True)
class Selection:
    from_phase: str | None = None
    to_phase: str | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()


def _check(name: str, names: list[str], flag: str) -> None:
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]}?" if close else f"phases: {', '.join(names)}"
        raise UsageError(f"{flag} {name}: no such phase", hint=hint)


def select(catalog: tuple[Phase, ...], sel: Selection) -> list[Phase]:
    names = [p.name for p in catalog]
    for flag, values in (("--from", [sel.from_phase] if sel.from_phase else []),
                         ("--to", [sel.to_phase] if sel.to_phase else []),
                         ("--only", sel.only), ("--skip", sel.skip)):
        for value in values:
            _check(value, names, flag)
    if sel.only and (sel.from_phase or sel.to_phase):
        raise UsageError("--only cannot be combined with --from or --to",
                         hint="use --only alone, or a --from/--to range")
    if sel.only:
        chosen = [p for p in catalog if p.name in sel.only]
    else:
        start = names.index(sel.from_phase) if sel.from_phase else 0
        end = names.index(sel.to_phase) if sel.to_phase else len(names) - 1
        if start > end:
            raise UsageError(f"--from {sel.from_phase} comes after --to {sel.to_phase}",
                             hint=f"phase order: {' -> '.join(names)}")
        chosen = list(catalog[start:end + 1])
    chosen = [p for p in chosen if p.name not in sel.skip]
    if not chosen:
        raise UsageError("no phase left to run", hint="loosen --only/--skip")
    return chosen
