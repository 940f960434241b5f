"""The TEST DOUBLES written in Go (each a module under tests/doubles with a go.mod) pass their own
tests, built from Go modules as the lab builds everything:
- the operands that read GPUs through NVML (tests/doubles/gpu_operator/operands): the device
  plugin against the device-plugin API of the kubelet's module (registration, ListAndWatch,
  Allocate, registering again after a kubelet restart), the real plugin's config refusals,
  resource rules (MIG strategies, time-slicing) and CDI listing; GFD's labels and its NodeFeature
  object; the DCGM exporter's inputs and metrics;
- the container toolkit (tests/doubles/gpu_operator/toolkit): the env NVIDIA's operator gives it
  in NRI plugin mode and what the real one refuses, the management CDI spec from the driver
  root, and the CDI devices each container's annotation asks for."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

DOUBLES = Path(__file__).resolve().parents[1] / "doubles"
MODULES = sorted(str(p.parent.relative_to(DOUBLES)) for p in DOUBLES.rglob("go.mod"))
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuboot" / "doubles"


def test_every_go_double_is_found():
    assert {"gpu_operator/operands", "gpu_operator/toolkit", "network_operator/operands", "deviceplugin"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_the_go_double_passes_its_go_tests(module):
    if shutil.which("go") is None:
        pytest.fail("Go is not on PATH: bootstrap/setup.sh checks for it")
    env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=mod",
               GOMODCACHE=str(CACHE / "gomodcache"), GOCACHE=str(CACHE / "gocache"))
    done = subprocess.run(["go", "test", "-count=1", "./..."], cwd=DOUBLES / module, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.startswith("ok"), done.stdout
