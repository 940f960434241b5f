"""What tests/gpu/run.sh captured on a real GPU machine (tests/gpu/fixtures/<kind>/), held
against what gpuboot plans and checks for that GPU: preflight's hardware module on the real
card, the same facts through the GPU plan of a one-node inventory and through the checks a
customer's node would meet, NVIDIA's gpu-feature-discovery labels against what validate and the
GFD double gives, the CDI spec nvidia-ctk wrote for a driver root that is not /, and
the pods started through CRI with and without the CDI device. No GPU needed: these are the
recorded outputs; run.sh on a GPU machine makes them again."""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuboot import gpus, matrix
from gpuboot.config.loader import load_cluster
from tests.doubles.hardware.sysfs import build_tree
from tests.support import go_doubles, gpu_operands

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "gpu" / "fixtures"
INVENTORY = ROOT / "tests" / "gpu" / "inventory" / "hosts.ini"
DOUBLE_SPEC = ROOT / "tests" / "gpu" / "doubles" / "nvidia-cdi-double.yaml"
MODULE_PATH = ROOT / "roles" / "preflight" / "library" / "gpuboot_hardware_facts.py"
DRIVER_ROOT = "/usr/local/nvidia"
KINDS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
# The host of tests/gpu/inventory that declares each kind's GPU (run.sh's GPUBOOT_PROOF_HOST).
HOSTS = {"nvidia-h200": "gpu1", "nvidia-h100-x1": "gpu2"}

_spec = importlib.util.spec_from_file_location("gpuboot_hardware_facts", MODULE_PATH)
hw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hw)


def read(kind: str, name: str) -> str:
    return (FIXTURES / kind / name).read_text()


def labels(kind: str, strategy: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in read(kind, f"gfd-{strategy}.labels").splitlines() if "=" in line)


def real_facts(kind: str) -> dict:
    return json.loads(read(kind, "hardware-facts.json"))


def planned(kind: str):
    """gpuboot's plan for the host that declares this kind's GPU."""
    return load_cluster(INVENTORY).gpu_plan.nodes[HOSTS[kind]]


def test_fixtures_exist_for_a_gpu_kind_the_inventory_declares():
    assert KINDS, "no GPU run recorded under tests/gpu/fixtures"
    assert set(KINDS) <= set(HOSTS), "a kind's run needs its host in tests/gpu/inventory and in HOSTS"


@pytest.mark.parametrize("kind", KINDS)
def test_every_step_passed_but_preflight_which_names_only_what_the_machine_lacks(kind):
    steps = {line.split("\t")[0]: int(line.split("\t")[1]) for line in read(kind, "steps.tsv").splitlines()}
    assert {name for name, rc in steps.items() if rc != 0} == {"02-preflight"}
    summary = read(kind, "02-preflight.log").split("Preflight found problems on 1 host(s):", 1)[1].split("\n\n", 1)[0]
    problems = [line.strip() for line in summary.splitlines() if line.strip()]
    # The lent machine has no systemd, iproute2 or kmod and no network: a customer's node would
    # be refused for the same reasons. Nothing about its GPU.
    assert problems and all(p.startswith(f"{HOSTS[kind]}: ") for p in problems)
    assert not [p for p in problems if "GPU" in p or "nouveau" in p or "driver" in p], problems
    assert f"{HOSTS[kind]}: systemctl: not found, install systemd" in problems


@pytest.mark.parametrize("kind", KINDS)
def test_preflight_module_on_the_real_gpu_finds_the_declared_model(kind):
    result = real_facts(kind)
    found = result["ansible_facts"]["gpuboot_hardware"]
    plan = planned(kind)
    assert result["problems"] == []
    assert [(g["model"], g["device_id"], g["architecture"], g["mig"], g["driver"]) for g in found["gpus"]] == [
        (plan.model.name, plan.model.pci_devices[0], plan.model.architecture, True, "nvidia")]
    assert len(found["gpus"]) == plan.count
    # The GPU Operator's driver is open kernel modules; so is the one this machine runs.
    assert found["nvidia_driver"]["open"] is True and found["nvidia_driver"]["version"].startswith("580.")
    assert found["nvidia_loaded"] and not found["nouveau_loaded"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_sysfs_double_built_from_the_capture_reads_as_the_real_machine(kind, tmp_path):
    """The /sys double (tests/doubles/hardware) fed this machine's capture gives the facts the
    module gave on the machine itself."""
    capture = json.loads(read(kind, "hardware-capture.json"))
    sys_root, proc_root = build_tree(capture, tmp_path / "host")
    from_double = hw.discover(str(sys_root), str(proc_root), [], gpus.catalog_data())
    real = real_facts(kind)["ansible_facts"]["gpuboot_hardware"]
    for key in ("gpus", "nvidia_driver", "nvswitches", "connectx", "secure_boot", "nvidia_loaded", "nouveau_loaded"):
        assert from_double[key] == real[key], key


@pytest.mark.parametrize("kind", KINDS)
def test_the_checks_a_customers_node_meets_on_these_facts(kind):
    found = real_facts(kind)["ansible_facts"]["gpuboot_hardware"]
    model = planned(kind).model
    other = next(m for m in gpus.catalog().values() if m.pci_devices != model.pci_devices and m.mig)
    layout = f"all-{next(iter(model.mig.profiles))}"

    def problems(declared):
        return hw.evaluate(found, True, declared, [], "open")[0]

    assert problems({"model": model.name, "count": 1}) == []
    assert problems({"model": model.name, "count": 1, "mig": {"layout": layout}}) == []
    assert any("the inventory expects 8 GPU(s), found 1" in p for p in problems({"model": model.name, "count": 8}))
    assert any(f"the inventory says {other.name}, the node has {model.product}" in p
               for p in problems({"model": other.name, "count": 1}))


@pytest.mark.parametrize("kind", KINDS)
def test_gfd_labels_are_what_validate_and_the_plan_expect(kind):
    mixed, single = labels(kind, "mixed"), labels(kind, "single")
    plan = planned(kind)
    # validate's check (gpuboot_cluster_check.check_gfd_labels) compares exactly these.
    for key, value in plan.gfd_labels().items():
        assert mixed[key] == value, key
    assert mixed["nvidia.com/gpu.count"] == str(plan.count)
    assert mixed["nvidia.com/mig.capable"] == str(plan.model.mig is not None).lower()
    assert mixed["nvidia.com/mig.strategy"] == "mixed" and single["nvidia.com/mig.strategy"] == "single"
    assert mixed["nvidia.com/gpu.replicas"] == "1" and mixed["nvidia.com/gpu.sharing-strategy"] == "none"
    # The driver GFD reads through NVML is the one preflight read from /proc.
    driver = real_facts(kind)["ansible_facts"]["gpuboot_hardware"]["nvidia_driver"]["version"]
    assert mixed["nvidia.com/cuda.driver-version.full"] == driver
    assert int(mixed["nvidia.com/cuda.runtime-version.major"]) >= 12
    # The plan's node resources match what the device plugin would advertise for one whole GPU.
    assert plan.resources("mixed") == {"nvidia.com/gpu": int(mixed["nvidia.com/gpu.count"])}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("strategy", ["mixed", "single"])
def test_the_gfd_double_labels_as_real_gfd_does(kind, strategy, tmp_path):
    """The GFD double (tests/doubles/gpu_operator/operands, the one the lab's GPU Operator runs),
    given the GPUs real NVML reported on that machine, labels a subset of what real GFD labelled
    there, letter for letter, and everything validate and the plan read of it."""
    real = labels(kind, strategy)
    count = int(real["nvidia.com/gpu.count"])
    gpus_file = tmp_path / "gpus.json"
    gpus_file.write_bytes(gpu_operands.double_gpus(
        real["nvidia.com/gpu.product"].replace("-", " "), count, family=real["nvidia.com/gpu.family"],
        mig_capable=real["nvidia.com/mig.capable"] == "true", memory_mib=int(real["nvidia.com/gpu.memory"])))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "flags": {"migStrategy": strategy}}))
    out = tmp_path / "gfd"
    done = subprocess.run([str(go_doubles.build("gpu_operator/operands", "gpu-feature-discovery"))],
                          env={"GFD_ONESHOT": "true", "USE_NODE_FEATURE_API": "false", "GFD_OUTPUT_FILE": str(out),
                               "GPUBOOT_DOUBLE_HARDWARE": str(gpus_file), "CONFIG_FILE": str(config),
                               "GFD_NO_TIMESTAMP": "true"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    made = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert {"nvidia.com/gpu.count", "nvidia.com/gpu.product", "nvidia.com/gpu.family", "nvidia.com/mig.capable"} <= set(made)
    assert made == {k: real.get(k) for k in made}, {k: (v, real.get(k)) for k, v in made.items() if real.get(k) != v}
    plan = planned(kind)
    assert plan.model.gfd_product == made["nvidia.com/gpu.product"]


@pytest.mark.parametrize("kind", KINDS)
def test_nvidia_ctk_spec_for_a_driver_root_that_is_not_slash(kind):
    spec = yaml.safe_load(read(kind, "cdi-nvidia.yaml"))
    assert spec["kind"] == "nvidia.com/gpu"
    names = {d["name"] for d in spec["devices"]}
    assert {"0", "all"} <= names and any(n.startswith("GPU-") for n in names)
    edits = spec["containerEdits"]
    nodes = {n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])}
    nodes |= {n["path"] for n in edits.get("deviceNodes", [])}
    assert {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= nodes
    mounts = edits["mounts"]
    # Libraries and binaries come from the driver root and land where a container looks for them.
    assert all(m["hostPath"].startswith((DRIVER_ROOT + "/", "/dev/", "/run/")) for m in mounts), mounts
    assert not [m for m in mounts if m["containerPath"].startswith(DRIVER_ROOT)]
    smi = [m for m in mounts if m["hostPath"] == f"{DRIVER_ROOT}/bin/nvidia-smi"]
    assert smi and smi[0]["containerPath"] == "/bin/nvidia-smi"
    assert any(m["hostPath"].startswith(f"{DRIVER_ROOT}/lib64/libnvidia-ml.so") for m in mounts)
    hooks = edits["hooks"]
    assert all(h["path"].endswith("/nvidia-cdi-hook") for h in hooks)
    assert any("update-ldcache" in h["args"] for h in hooks)
    # The CPU machine's double has the kind and the device names containerd resolves.
    double = yaml.safe_load(DOUBLE_SPEC.read_text())
    assert double["kind"] == spec["kind"] and {d["name"] for d in double["devices"]} <= names


@pytest.mark.parametrize("kind", KINDS)
def test_only_the_pod_with_the_cdi_device_sees_the_gpu(kind):
    with_gpu, without = read(kind, "09-pod-with-gpu.log"), read(kind, "10-pod-without-gpu.log")
    assert "exit code: 0" in with_gpu
    assert f"GPU 0: {labels(kind, 'mixed')['nvidia.com/gpu.product'].replace('-', ' ')} (UUID: GPU-" in with_gpu
    assert f"{labels(kind, 'mixed')['nvidia.com/gpu.memory']} MiB" in with_gpu
    assert "crw-rw-rw-" in with_gpu and "/dev/nvidia0" in with_gpu
    assert "exit code: 127" in without and "nvidia-smi: not found" in without
    assert "ls: /dev/nvidia*: No such file or directory" in without


@pytest.mark.parametrize("kind", KINDS)
def test_containerd_2_ran_the_rendered_config_and_gpuboots_check_passed(kind):
    check = read(kind, "06-containerd-check.log")
    assert "failed=0" in check and "ok=" in check
    dump = read(kind, "containerd-config-dump.toml")
    assert "SystemdCgroup = false" in dump  # the machine's drop-in, merged by containerd itself
    assert "sandbox = 'mirror.gpu-proof.internal:5000/registry.k8s.io/pause:3.10.1'" in dump
    assert "default_runtime_name = 'runc'" in dump and "'/var/run/cdi'" in dump
    assert "containerd github.com/containerd/containerd/v2 v2.4.2" in read(kind, "01-unpack.log")


@pytest.mark.parametrize("kind", KINDS)
def test_the_gpu_tables_memory_and_the_smoke_images_cuda_fit_what_gfd_reports(kind):
    """The GPU table's name carries the card's memory (H200-SXM-141GB): GFD's MiB, in GiB, must
    agree within 2 %. validate's smoke Job runs the matrix's CUDA base image with nvidia-smi: the
    CUDA the driver supports (GFD's cuda.runtime-version) must be at least the image's."""
    real = labels(kind, "mixed")
    plan = planned(kind)
    named_gb = int(plan.model.name.rsplit("-", 1)[1].removesuffix("GB"))
    gib = int(real["nvidia.com/gpu.memory"]) / 1024
    assert abs(gib - named_gb) / named_gb < 0.02, (gib, named_gb)
    release = load_cluster(INVENTORY).settings.release
    smoke = matrix.entry(release)["images"]["gpu_operator"]["smokeTest"]
    image_cuda = tuple(int(x) for x in smoke.split(":")[1].split("-")[0].split(".")[:2])
    driver_cuda = (int(real["nvidia.com/cuda.runtime-version.major"]), int(real["nvidia.com/cuda.runtime-version.minor"]))
    assert driver_cuda >= image_cuda, (smoke, driver_cuda)
