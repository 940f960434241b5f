"""NVIDIA's operators made real in a kubernetes-flavour lab's bundle (tests/support/addon_lab.py):
doubles first for every image the mirror plan lists for the component (and validate), then the
real chart at the tag the release pins, packaged by the real helm from the source tree
on this machine, and the images built from source (with the hardware's TEST DOUBLES) over them.
An image the plan missed is in neither, so the lab cannot pull it."""
from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpuboot import matrix
from gpuboot.config.loader import load_cluster
from gpuboot.mirror.bundle import Artifact, Bundle
from gpuboot.mirror.plan import PlannedChart, Target, build
from gpuboot.mirror.pull import chart_artifact
from tests.integration.test_double_schemas_vs_real_charts import source_tree
from tests.support.addon_doubles import add_to_bundle


def packaged(helm: Path, chart: str, version: str, release_name: str, into: Path) -> bytes:
    """The chart at the release's tag, packaged by the real helm from the source tree (skips,
    naming the tree, where it is absent)."""
    upstream, git_dir, tag = source_tree(chart, version, release_name)
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", tag, upstream.chart_dir],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    done = subprocess.run([str(helm), "package", str(into / upstream.chart_dir), "--version", version,
                           "--app-version", version, "--destination", str(into)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return next(into.glob(f"{chart}-*.tgz")).read_bytes()


def into_bundle(node_lab, release_name: str, component: str, chart: str, version: str,
                real_images: Callable[[Bundle, list[str]], list[Artifact]]) -> list[str]:
    """The bundle's `component` made real: a double of every image the plan lists for it (and
    validate), then the real chart and `real_images(bundle, planned image refs)` over them.
    Returns every planned image ref."""
    images = add_to_bundle(node_lab.bundle, node_lab.inventory, components=(component, "validate"))
    cluster = load_cluster(node_lab.inventory)
    release = matrix.load(cluster.settings.release)
    planned = next(c for c in build(release, Target.of(cluster, release)).only({component}).charts if c.name == chart)
    assert str(planned.version) == str(version), (planned, version)
    bundle = Bundle(node_lab.bundle)
    name, artifacts = bundle.read_manifest()
    with tempfile.TemporaryDirectory() as tmp:
        archive = packaged(node_lab.helm, chart, version, release_name, Path(tmp))
    real = [chart_artifact(bundle, PlannedChart(component, planned.repository, chart, version), archive),
            *real_images(bundle, images)]
    replaced = {a.ref for a in real}
    bundle.write_manifest(name, [a for a in artifacts if a.ref not in replaced] + real)
    return images


def keep(out: Path, info: dict, namespace: str, shown: dict[str, list[str]], tail: int = 100) -> None:
    """What the cluster showed, for whoever reads a failure: `shown` (file label -> kubectl
    arguments), the nodes, workloads and events, and the last lines of each pod of `namespace`."""
    out.mkdir(parents=True, exist_ok=True)
    base = [str(info["kubectl"]), "--kubeconfig", str(info["kubeconfig"]), "--request-timeout=20s"]
    for label, args in {**shown, "nodes": ["get", "nodes", "-o", "yaml"],
                        "workloads": ["get", "ds,deploy,pods,jobs", "-A", "-o", "wide"],
                        "events": ["get", "events", "-A", "--sort-by=.lastTimestamp"]}.items():
        done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)
        (out / f"{label}.txt").write_text(done.stdout + done.stderr)
    names = subprocess.run([*base, "-n", namespace, "get", "pods", "-o", "name"], capture_output=True,
                           text=True, timeout=60).stdout.split()
    for pod in names:
        done = subprocess.run([*base, "-n", namespace, "logs", pod, "--all-containers", f"--tail={tail}"],
                              capture_output=True, text=True, timeout=60)
        (out / f"log-{pod.split('/')[-1]}.txt").write_text(done.stdout + done.stderr)
