"""NVIDIA's GPU Operator as the lab runs it for real: the operator, its validator and NFD built
from their sources (`gpuboot_lab.operators`), the device plugin's image with its real
config-manager, and TEST DOUBLES only where a GPU is needed:
- the driver: a node's `nvidia-smi` double and the file that stands for what NVML reports (its
  double GPUs), at the driver root `/` of a "preinstalled" driver;
- the container toolkit in NRI plugin mode (tests/doubles/gpu_operator/toolkit);
- the device plugin, GPU Feature Discovery, the DCGM exporter and the MIG manager: one
  multi-call Go binary (tests/doubles/gpu_operator/operands) under each operand's name;
- the validator's CUDA sample (`vectorAdd`)."""
from __future__ import annotations

import json

from gpuboot.matrix import Release
from gpuboot.mirror.bundle import Artifact, Bundle
from gpuboot_lab import operators
from tests.support import go_doubles
from tests.support.addon_doubles import NVIDIA_SMI, VECTOR_ADD
from tests.support.shell_images import shell_image

# Where the driver double keeps what NVML would report; the toolkit double's management CDI
# spec mounts it into the operands, as the real one mounts the driver's libraries.
HARDWARE = "/run/gpuboot-double/gpus.json"
# The DCGM exporter's collectors: the file the operator's DaemonSet names, as the image has it.
DCGM_COLLECTORS = "etc/dcgm-exporter/dcp-metrics-included.csv"
DCGM_FIELDS = b"""# TEST DOUBLE of the exporter's collectors file: the fields the double reports.
DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).
"""


def double_gpus(product: str, count: int, *, family: str, mig_capable: bool, memory_mib: int,
                pci_device_id: str = "") -> bytes:
    """The driver double's view of a node's GPUs (tests/doubles/gpu_operator/operands' Hardware).
    pci_device_id: NVML's PCI device and vendor id (0x233010DE), which mig-parted's device
    filters match."""
    return json.dumps({"gpus": [{"index": i, "uuid": f"GPU-{i:08d}-0000-4000-8000-double000000", "product": product,
                                 "family": family, "migCapable": mig_capable, "memoryMiB": memory_mib,
                                 **({"pciDeviceId": pci_device_id} if pci_device_id else {})}
                                for i in range(count)]}, indent=2).encode()


def driver_files(gpus: bytes) -> list[tuple[str, bytes, int]]:
    """(path on the node, content, mode) of the driver double."""
    return [("/usr/bin/nvidia-smi", NVIDIA_SMI, 0o755), (HARDWARE, gpus, 0o644)]


def images(bundle: Bundle, release: Release) -> list[Artifact]:
    """The GPU Operator's images for the lab: built from source where they can be, doubles where a GPU is needed."""
    refs = release.images["gpu_operator"]
    operands = go_doubles.build("gpu_operator/operands", "gpu-operands").read_bytes()
    toolkit = go_doubles.build("gpu_operator/toolkit", "nvidia-toolkit").read_bytes()
    built = operators.images(bundle, release, specs=tuple(s for s in operators.OPERATORS if s.component == "gpu_operator"),
                             stand_ins={"operator": [("usr/bin/vectorAdd", VECTOR_ADD, 0o755)],
                                        "devicePlugin": [("usr/bin/nvidia-device-plugin", operands, 0o755),
                                                         ("usr/bin/gpu-feature-discovery", operands, 0o755)]})
    return built + [
        shell_image(bundle, refs["toolkit"], [("usr/bin/nvidia-toolkit", toolkit, 0o755)], ["/usr/bin/nvidia-toolkit"]),
        shell_image(bundle, refs["dcgmExporter"], [("usr/bin/dcgm-exporter", operands, 0o755),
                                                     (DCGM_COLLECTORS, DCGM_FIELDS, 0o644)], ["/usr/bin/dcgm-exporter"]),
        # The operator runs the MIG manager through its entrypoint ConfigMap (/bin/sh, cat).
        shell_image(bundle, refs["migManager"], [("usr/bin/nvidia-mig-manager", operands, 0o755)],
                     ["/usr/bin/nvidia-mig-manager"], applets=("cat",)),
    ]
