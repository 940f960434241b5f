"""TEST DOUBLES of the add-ons' charts and images.

- Charts: the double charts under tests/doubles/charts (Calico's and Argo CD's), packaged by
  the real helm at the release matrix's chart version.
- Images, added to a lab bundle so that they enter the lab's air-gapped mirror exactly as
  `gpuboot mirror import` brings the real ones in: every image the mirror plan lists for the cluster's GPU Operator and for validate,
  each a double (Debian's static busybox, `sleep` as entrypoint, a `nvidia-smi` that says it
  is a double, and an `agnhost` whose netexec serves HTTP and whose connect dials it), except
  those the lab bundle already holds for real (agnhost, built from Kubernetes' source).
  Nothing else is added: an operand whose image the plan missed cannot be pulled in the lab."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from gpuboot import matrix
from gpuboot.config.loader import load_cluster
from gpuboot.mirror import plan as mirror_plan
from gpuboot.mirror.bundle import Artifact, Bundle
from gpuboot_lab.artifacts import image_artifact, layer_tar
from tests.support.chart_versions import schema_at
from tests.support.mirror_fixture import IMAGE_CACHE
from tests.support.oci_layout import busybox_binaries

CHARTS = Path(__file__).resolve().parents[1] / "doubles" / "charts"
# Lists the GPUs the node's double hardware says it has (the real one lists what the device
# plugin gave the container); the smoke Job only runs where its request was scheduled.
NVIDIA_SMI = b"""#!/bin/sh
echo "nvidia-smi TEST DOUBLE on $(cat /etc/hostname 2>/dev/null || hostname): no real GPU in the lab"
echo "GPU 0: ${GPUBOOT_DOUBLE_PRODUCT:-double} (UUID: GPU-00000000-double)"
"""


AGNHOST = b"""#!/bin/sh
# agnhost TEST DOUBLE: the two subcommands validate uses.
case "$1" in
  netexec) port=${2#--http-port=}; mkdir -p /tmp/www && echo ok > /tmp/www/index.html
           exec /bin/busybox httpd -f -p "$port" -h /tmp/www ;;
  connect) exec /bin/busybox wget -q -T 5 -O /dev/null "http://$2/" ;;
  *) echo "agnhost TEST DOUBLE: $1 is not doubled" >&2; exit 2 ;;
esac
"""

# The CUDA sample NVIDIA's validator image carries (its cuda-validation runs it in a pod that
# asks for the management CDI device). A CUDA kernel needs a GPU; the double checks what the
# sample would find first, a driver in the container (the toolkit's CDI injection of nvidia-smi
# from the driver root), and says what the sample says.
VECTOR_ADD = b"""#!/bin/sh
echo "vectorAdd TEST DOUBLE: no real GPU in the lab"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
  echo "Failed to allocate device vector A (error code no CUDA-capable device is detected)!" >&2
  exit 1
fi
echo "[Vector addition of 50000 elements]"
echo "Test PASSED"
echo "Done"
"""


def double_image(bundle: Bundle, ref: str, busybox: bytes) -> Artifact:
    base = layer_tar([("bin/busybox", busybox, 0o755), ("bin/sh", busybox, 0o755), ("usr/bin/agnhost", AGNHOST, 0o755)])
    # As the real images: agnhost's runs agnhost, an operand's runs until stopped.
    entrypoint = ["/usr/bin/agnhost"] if ref.split(":")[0].endswith("/agnhost") else ["/bin/busybox", "sleep", "2147483647"]
    return image_artifact(bundle, ref, "usr/bin/nvidia-smi", NVIDIA_SMI, entrypoint, base)


def double_chart_at(name: str, version: str, into: Path) -> Path:
    """A copy of the double chart `name` in `into` as the real chart is at `version`: its values
    schema and CRDs without what the real chart gained later (tests/support/chart_versions.py)."""
    source = into / name
    if source.is_dir():
        return source
    shutil.copytree(CHARTS / name, source)
    schema = source / "values.schema.json"
    if schema.is_file():
        schema.write_text(json.dumps(schema_at(json.loads(schema.read_text()), version), indent=2) + "\n")
    for crd in sorted((source / "crds").glob("*.yaml")):
        crd.write_text(yaml.safe_dump(schema_at(yaml.safe_load(crd.read_text()), version), sort_keys=False))
    return source


def package_chart(helm: Path, name: str, version: str, out: Path) -> bytes:
    """The double chart `name` packaged by helm at `version` (the matrix's)."""
    source = double_chart_at(name, version, out / "source")
    proc = subprocess.run([str(helm), "package", str(source), "--version", version, "--app-version", version,
                           "--destination", str(out)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return next(out.glob(f"{name}-*.tgz")).read_bytes()


def add_to_bundle(bundle_dir: Path, inventory: Path, components: tuple[str, ...] = ("gpu_operator", "validate")
                  ) -> list[str]:
    """Add a double of every image the mirror plan lists for `components` to the bundle (the
    charts are the real ones, tests/support/upstream_charts.py); return the image refs."""
    cluster = load_cluster(inventory)
    release = matrix.load(cluster.settings.release)
    plan = mirror_plan.build(release, mirror_plan.Target.of(cluster, release)).only(components)
    bundle = Bundle(bundle_dir)
    name, artifacts = bundle.read_manifest()
    busybox = busybox_binaries(IMAGE_CACHE)["amd64"]
    present = {a.ref for a in artifacts}  # real ones the lab built (agnhost) win over doubles
    added = [double_image(bundle, str(image.ref), busybox) for image in plan.images if str(image.ref) not in present]
    known = {a.ref for a in added}
    bundle.write_manifest(name, [a for a in artifacts if a.ref not in known] + added)
    return [a.ref for a in added]
