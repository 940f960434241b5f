"""docs/phases.md's tables are generated from the phase catalog (bootstrap/gpuboot/phases/catalog.py):
this test fails when the two disagree, and prints the command that writes them again:

    .venv/bin/python -m tests.unit.test_docs_phases
"""
from __future__ import annotations

from pathlib import Path

from gpuboot.phases import catalog

DOC = Path(__file__).resolve().parents[2] / "docs" / "phases.md"
BEGIN, END = "<!-- generated from the phase catalog: begin -->", "<!-- generated from the phase catalog: end -->"


def _what(phase: catalog.Phase) -> str:
    if callable(phase.result):
        return "depends on the settings: " + " ".join((phase.result.__doc__ or "").split())
    found = phase.result
    parts = [f"`{p}`" for p in (*found.files, *found.present)]
    parts += [f"{s} active" for s in found.services]
    parts += [f"CIS modes ({', '.join(found.cis_modes)})"] if found.cis_modes else []
    if phase.gate:
        return "nothing: the gate runs on every run that reaches it"
    if phase.read_only:
        return "nothing: read-only, runs when a later phase does"
    return ", ".join(parts) or "nothing recorded"


def table(phases: tuple[catalog.Phase, ...]) -> str:
    rows = ["| # | phase | what | playbook | hosts | pulls from the mirror | leaves on its hosts |",
            "|---|---|---|---|---|---|---|"]
    for index, phase in enumerate(phases, 1):
        pulls = ", ".join([*phase.pulls, *(["packages"] if phase.installs_packages else [])])
        rows.append(f"| {index} | `{phase.name}` | {phase.title} | `playbooks/{phase.playbook}` | `{phase.hosts}` "
                    f"| {pulls or '-'} | {_what(phase)} |")
    return "\n".join(rows)


def generated() -> str:
    return (f"{BEGIN}\n\n## `gpuboot up`, in order\n\n{table(catalog.UP)}\n\n"
            f"## `gpuboot upgrade`, in order\n\n{table(catalog.UPGRADE)}\n\n{END}")


def test_docs_phases_match_the_catalog():
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC} lost its generated section markers"
    current = text[text.index(BEGIN):text.index(END) + len(END)]
    assert current == generated(), "docs/phases.md differs from the catalog: run .venv/bin/python -m tests.unit.test_docs_phases"


if __name__ == "__main__":
    text = DOC.read_text()
    DOC.write_text(text[:text.index(BEGIN)] + generated() + text[text.index(END) + len(END):])
    print(f"wrote {DOC}")
