"""The pieces of the real-GPU proof (tests/gpu/run.sh), checked on a machine without a GPU:
the kit builds (containerd 2, runc, crictl, the NVIDIA toolkit, gpu-feature-discovery, the probe
image), and the script itself runs here in a mount and PID namespace of its own. Its containerd
gets the config.toml container_runtime renders for the GPU node, gpuboot's effective-config
check passes on it, and a pod through CRI that asks for nvidia.com/gpu=all gets what a CDI spec
gives (a double here: /dev/null for the device, a script for nvidia-smi) while a pod without it
gets nothing. What needs the GPU (NVML, nvidia-ctk's real spec) fails here, and is expected to."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "tests" / "gpu" / "inventory" / "hosts.ini"
DOUBLE_SPEC = ROOT / "tests" / "gpu" / "doubles" / "nvidia-cdi-double.yaml"
# Where the script writes as root: each gets a tmpfs in the test's own mount namespace.
PRIVATE = ("/etc/containerd", "/var/lib/containerd", "/run/containerd", "/run/cdi", "/var/log/pods")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kit_archive(tmp_path_factory) -> Path:
    if shutil.which("go") is None or shutil.which("podman") is None:
        pytest.skip("the kit is built with go and podman (bootstrap/setup.sh installs podman)")
    from gpuboot_lab.gpu_kit import GpuKit, available_tools, node_files
    tools, missing = available_tools()
    for reason in missing:
        print(f"not built: {reason}")
    stage = GpuKit(log=print).stage(tmp_path_factory.mktemp("kit"), node_files(INVENTORY, "gpu1"), tools)
    archive = tmp_path_factory.mktemp("kit-archive") / "kit.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(stage, arcname=".")
    return archive


@pytest.fixture(scope="module")
def results(kit_archive, tmp_path_factory) -> dict[str, str]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("run.sh starts containerd as root; needs root and unshare")
    work = tmp_path_factory.mktemp("proof")
    mounts = " && ".join(f"mkdir -p {p} && mount -t tmpfs tmpfs {p}" for p in PRIVATE)
    env = dict(os.environ, OUT=str(work / "out"), KIT_ARCHIVE=str(kit_archive), GPUBOOT_KIT_DIR=str(work / "kit"),
               GPUBOOT_CDI_SPEC_DOUBLE=str(DOUBLE_SPEC), TMPDIR=str(work),
               # The script's Ansible runs under this environment's Python (the machine's own there).
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "sh", "-c",
                           f'{mounts} && exec bash "$0"', str(ROOT / "tests" / "gpu" / "run.sh")],
                          env=env, capture_output=True, text=True, timeout=600)
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    for path in PRIVATE:  # the mount points the namespace needed, if they were made for it
        if os.path.isdir(path) and not os.listdir(path):
            os.rmdir(path)
    unpacked = work / "results"
    with tarfile.open(work / "out" / "results.tgz") as tar:
        tar.extractall(unpacked, filter="data")
    return {p.name: p.read_text(errors="replace") for p in unpacked.iterdir() if p.is_file()}


def steps(results: dict[str, str]) -> dict[str, int]:
    return {line.split("\t")[0]: int(line.split("\t")[1]) for line in results["steps.tsv"].splitlines()}


def test_containerd_2_runs_the_rendered_config_and_passes_gpuboots_check(results):
    rc = steps(results)
    assert rc["01-unpack"] == 0, results["01-unpack.log"]
    assert rc["05-containerd"] == 0, results["05-containerd.log"]
    assert "v2.4.2" in results["01-unpack.log"]
    # gpuboot's own check tasks, run by Ansible against the running daemon.
    assert rc["06-containerd-check"] == 0, results["06-containerd-check.log"]
    check_log = results["06-containerd-check.log"]
    # One check names every setting a drop-in undid; it is skipped when none was lost.
    for task in ("read the effective configuration", "check no drop-in undid what kubelet and the GPU toolkit rely on",
                 "check the CRI plugin loaded"):
        assert task in check_log, check_log
    assert "lost what gpuboot set" not in check_log and " failed=0 " in check_log, check_log
    dump = results["containerd-config-dump.toml"]
    assert "sandbox = 'mirror.gpu-proof.internal:5000/registry.k8s.io/pause:3.10.1'" in dump
    assert "config_path = '/etc/containerd/certs.d'" in dump
    assert "'/var/run/cdi'" in dump and "SystemdCgroup = false" in dump


def test_a_pod_gets_the_gpu_only_through_its_cdi_device(results):
    rc = steps(results)
    assert rc["08-probe-image"] == 0, results["08-probe-image.log"]
    assert rc["09-pod-with-gpu"] == 0, results["09-pod-with-gpu.log"]
    with_gpu = results["09-pod-with-gpu.log"]
    assert "exit code: 0" in with_gpu and "GPU 0: NVIDIA test double" in with_gpu
    assert "/dev/nvidia0" in with_gpu
    assert rc["10-pod-without-gpu"] == 0, results["10-pod-without-gpu.log"]
    without = results["10-pod-without-gpu.log"]
    assert "nvidia-smi: not found" in without and "No such file or directory" in without


def test_what_needs_a_gpu_fails_here_and_says_so(results):
    rc = steps(results)
    assert rc["02-preflight"] != 0 and "no NVIDIA GPU found" in results["02-preflight.log"]
    assert rc["02-hardware-facts"] != 0 and "no NVIDIA GPU found" in results["hardware-facts.json"]
    # gpu-feature-discovery is in the kit only where its source tree is on the machine.
    if "gpu-feature-discovery: command not found" in results["01-unpack.log"]:
        assert rc["03-gfd-mixed"] == 127, results["03-gfd-mixed.log"]
    else:
        assert rc["03-gfd-mixed"] != 0 and "ERROR_LIBRARY_NOT_FOUND" in results["03-gfd-mixed.log"]
