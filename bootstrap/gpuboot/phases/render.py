"""`gpuboot render`: every file the phases would write, without touching a host."""
from __future__ import annotations

from pathlib import Path

import yaml

from gpuboot.config.model import Cluster
from gpuboot.errors import UsageError
from gpuboot.phases.catalog import UP, Phase
from gpuboot.phases.engine import Engine, RunOptions, Sink, raise_for
from gpuboot.state import ClusterState

RENDER = Phase("render", "Render configuration for review", "render.yml")
SETTINGS_FILE = Path("cluster") / "settings.yml"


def renderable_phases() -> list[str]:
    """Phases playbooks/render.yml knows how to render (its gpuboot_render_phases default)."""
    plays = yaml.safe_load(RENDER.path.read_text())
    return list(plays[0]["vars"]["gpuboot_render_phases"])


def write_settings(cluster: Cluster, path: Path) -> None:
    """The validated settings exactly as `gpuboot up` hands them to Ansible, for plain
    `ansible-playbook -i INVENTORY playbooks/up.yml -e @<this file>`. File references only:
    validation refuses inline secrets."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ("# Written by `gpuboot render`: the validated settings of cluster "
              f"{cluster.settings.cluster_name}, every default filled in.\n"
              "# ansible-playbook -i INVENTORY playbooks/up.yml -e @THIS_FILE\n")
    path.write_text(header + yaml.safe_dump(cluster.extravars(), sort_keys=False))


def render(cluster: Cluster, out: Path, phases: tuple[str, ...], state: ClusterState, sink: Sink) -> list[Path]:
    known = renderable_phases()
    catalog = [p.name for p in UP]
    for name in phases:
        if name not in catalog:
            raise UsageError(f"--phase {name}: no such phase", hint=f"phases: {', '.join(catalog)}")
        if name not in known:
            raise UsageError(f"phase {name} has nothing to render yet", hint=f"renderable: {', '.join(known)}")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    write_settings(cluster, out / SETTINGS_FILE)
    options = RunOptions(command="render", force=True, record_state=False,
                         extravars=(("gpuboot_render_dir", str(out)),
                                    ("gpuboot_render_phases", list(phases or known))),
                         resume_hint="gpuboot render {inventory} --out " + str(out))
    raise_for(Engine(cluster, state, options, sink).run([RENDER]))
    return sorted(p for p in out.rglob("*") if p.is_file())
