"""`gpuboot render`: every file the phases would write, per host, into a review directory,
without touching a host. Templates render in this process with Ansible's own variables and
template engine, so the text is what the phase writes.

Each role lists the files it owns once, as the role variable `<role>_files` (its tasks
write from the same list):

    <role>_files:
      <key>:
        src: name.j2            # in the role's templates/
        dest: /etc/...          # may use `item` when loop is set
        mode: "0644"
        wanted: <condition>     # optional, default true
        loop: <list>            # optional: one file per item
        redact: {var: text}     # optional: secrets render shows as a reference

A role listed under a play's `roles:` renders on the play's hosts where the role's `when`
holds, exactly the hosts the phase would write on."""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuboot import content
from gpuboot.ansible.templating import HostView, PlaybookVariables, PlayView
from gpuboot.config.model import Cluster
from gpuboot.errors import UsageError
from gpuboot.phases.catalog import UP, Phase, by_name

SETTINGS_FILE = Path("cluster") / "settings.yml"
FILES_SUFFIX = "_files"
# Hosts per extra render process: below this, forking costs more than it saves.
UNITS_PER_WORKER = 100


@dataclass(frozen=True)
class RenderedFile:
    host: str
    dest: str
    mode: str
    text: str


def owns_files(role_path: Path, role: str) -> bool:
    """Whether a role lists files it owns (in vars/ or defaults/)."""
    for layer in ("vars", "defaults"):
        path = role_path / layer / "main.yml"
        if path.is_file() and f"{role}{FILES_SUFFIX}" in (yaml.safe_load(path.read_text()) or {}):
            return True
    return False


def renderable_phases() -> list[str]:
    roles = content.content_dir() / "roles"
    return [p.name for p in UP if any(owns_files(roles / r, r) for r in p.roles)]


def write_settings(cluster: Cluster, path: Path) -> None:
    """The validated settings exactly as `gpuboot up` hands them to Ansible, for plain
    `ansible-playbook -i INVENTORY playbooks/up.yml -e @<this file>`. File references only:
    validation refuses inline secrets."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ("# Written by `gpuboot render`: the validated settings of cluster "
              f"{cluster.settings.cluster_name}, every default filled in.\n"
              "# ansible-playbook -i INVENTORY playbooks/up.yml -e @THIS_FILE\n")
    # The C dumper: the settings of 2,000 written-out hosts take the pure-Python one 40 s.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(header + yaml.dump(cluster.extravars(), Dumper=dumper, sort_keys=False))


def role_files(view: HostView, role: str, role_path: Path) -> Iterator[RenderedFile]:
    """The files one role writes on one host, rendered."""
    listed = view.variables.get(f"{role}{FILES_SUFFIX}") or {}
    for entry in listed.values():
        if not view.template(entry.get("wanted", True)):
            continue
        items = view.template(entry["loop"]) if "loop" in entry else [None]
        for item in items:
            each = view if item is None else view.with_vars(item=item)
            redacted = each.with_vars(**{name: each.template(text) for name, text in (entry.get("redact") or {}).items()})
            dest = each.template(entry["dest"])
            text = redacted.render_file(role_path / "templates" / entry["src"], dest)
            yield RenderedFile(view.host, dest, str(each.template(entry.get("mode", "0644"))), text)


@dataclass(frozen=True)
class Unit:
    """One host of one play, with the roles that render there."""

    play: PlayView
    roles: tuple[tuple[str, Path, tuple], ...]
    host: object


def units(variables: PlaybookVariables, phase: Phase) -> Iterator[Unit]:
    for play in variables.plays(phase.path):
        roles = tuple((name, path, tuple(when)) for name, path, when in play.roles() if owns_files(path, name))
        if roles:
            for host in play.hosts:
                yield Unit(play, roles, host)


def unit_files(variables: PlaybookVariables, unit: Unit) -> Iterator[tuple[str, RenderedFile]]:
    """(role, file) for every file the unit's roles write on its host."""
    view = variables.host_view(unit.play, unit.host)
    for name, path, when in unit.roles:
        if view.holds(list(when)):
            for rendered in role_files(view, name, path):
                yield name, rendered


def write_unit(variables: PlaybookVariables, unit: Unit, out: Path) -> list[Path]:
    written = []
    for _, rendered in unit_files(variables, unit):
        target = out / rendered.host / rendered.dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rendered.text)
        os.chmod(target, int(rendered.mode, 8))
        written.append(target)
    return written


def phase_files(cluster: Cluster, phase: str) -> Iterator[tuple[str, RenderedFile]]:
    """(role, file) for every file one phase writes, rendered in this process."""
    variables = PlaybookVariables(cluster.inventory_manager, cluster.extravars())
    for unit in units(variables, by_name(UP)[phase]):
        yield from unit_files(variables, unit)


# Set before the worker processes fork, so each inherits the loaded plays and variables.
_SHARED: tuple[PlaybookVariables, list[Unit], Path] | None = None


def _write_share(index: int, workers: int) -> list[Path]:
    variables, work, out = _SHARED
    return [path for unit in work[index::workers] for path in write_unit(variables, unit, out)]


def render_workers(units_count: int) -> int:
    """Processes to render with: one per core for a large fleet; none extra for a site."""
    return max(1, min(os.cpu_count() or 1, units_count // UNITS_PER_WORKER))


def render(cluster: Cluster, out: Path, phases: tuple[str, ...]) -> list[Path]:
    global _SHARED
    known = renderable_phases()
    catalog = by_name(UP)
    for name in phases:
        if name not in catalog:
            raise UsageError(f"--phase {name}: no such phase", hint=f"phases: {', '.join(catalog)}")
        if name not in known:
            raise UsageError(f"phase {name} has nothing to render yet", hint=f"renderable: {', '.join(known)}")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    write_settings(cluster, out / SETTINGS_FILE)
    variables = PlaybookVariables(cluster.inventory_manager, cluster.extravars())
    work = [unit for name in phases or known for unit in units(variables, catalog[name])]
    workers = render_workers(len(work))
    if workers == 1:
        written = [path for unit in work for path in write_unit(variables, unit, out)]
    else:
        _SHARED = (variables, work, out)
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                shares = pool.map(_write_share, range(workers), [workers] * workers)
                written = [path for share in shares for path in share]
        finally:
            _SHARED = None
    return sorted([out / SETTINGS_FILE, *written])
