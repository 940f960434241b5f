"""Images for the operands' TEST DOUBLES: Debian's static busybox as the shell (and the applets a
script of the operator's runs in the container), and the double's own files."""
from __future__ import annotations

from gpuboot.mirror.bundle import Artifact, Bundle
from gpuboot_lab.artifacts import layer_tar, layered_image
from tests.support.mirror_fixture import IMAGE_CACHE
from tests.support.oci_layout import busybox_binaries


def shell_image(bundle: Bundle, ref: str, files: list[tuple[str, bytes, int]], entrypoint: list[str],
                applets: tuple[str, ...] = ()) -> Artifact:
    """An image of busybox's shell (and `applets`) and `files`, running `entrypoint`."""
    busybox = busybox_binaries(IMAGE_CACHE)["amd64"]
    base = layer_tar([(f"bin/{name}", busybox, 0o755) for name in ("busybox", "sh", *applets)])
    return layered_image(bundle, ref, [base, layer_tar(files)], {"Entrypoint": entrypoint})
