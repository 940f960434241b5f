"""The device plugin TEST DOUBLE (tests/doubles/gpu_operator/device_plugin, Go): its own tests
against the device-plugin API of the kubelet's module (registration, ListAndWatch, Allocate,
registering again after a kubelet restart) and the real plugin's config refusals and resource
rules (MIG strategies, time-slicing). Built from Go modules, as the lab builds everything."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "gpu_operator" / "device_plugin"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuboot" / "doubles"


def test_the_device_plugin_double_passes_its_go_tests():
    if shutil.which("go") is None:
        pytest.fail("Go is not on PATH: bootstrap/setup.sh checks for it")
    env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=mod",
               GOMODCACHE=str(CACHE / "gomodcache"), GOCACHE=str(CACHE / "gocache"))
    done = subprocess.run(["go", "test", "-count=1", "./..."], cwd=DOUBLE, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.startswith("ok"), done.stdout
