"""`gpuboot render`: every file the phases would write, without touching a host."""
from __future__ import annotations

from pathlib import Path

import yaml

from gpuboot.config.model import Cluster
from gpuboot.errors import UsageError
from gpuboot.phases.catalog import CLUSTER, UP, Phase
from gpuboot.phases.engine import Engine, RunOptions, Sink, raise_for
from gpuboot.state import ClusterState

RENDER = Phase("render", "Render configuration for review", "render.yml", CLUSTER)


def renderable_phases() -> list[str]:
    """Phases playbooks/render.yml knows how to render (its gpuboot_render_phases default)."""
    plays = yaml.safe_load(RENDER.path.read_text())
    return list(plays[0]["vars"]["gpuboot_render_phases"])


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
    settings = out / "cluster" / "gpuboot.yml"
    settings.parent.mkdir(exist_ok=True)
    # The settings hold file references, never secret values: validation rejects inline ones.
    settings.write_text(yaml.safe_dump({"gpuboot": cluster.settings.model_dump(mode="json")}, sort_keys=False))
    options = RunOptions(command="render", force=True, record_state=False,
                         extravars=(("gpuboot_render_dir", str(out)),
                                    ("gpuboot_render_phases", list(phases or known))),
                         resume_hint="gpuboot render {inventory} --out " + str(out))
    raise_for(Engine(cluster, state, options, sink).run([RENDER]))
    return sorted(p for p in out.rglob("*") if p.is_file())
