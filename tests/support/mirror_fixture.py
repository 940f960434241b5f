"""Shared pieces of the mirror tests: a loopback upstream registry holding multi-arch
images under their upstream names (nvcr.io/..., registry.k8s.io/...), a release file
that lists them, and the `--source` mapping that points pulls at it."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpuboot.mirror.packages import new_signing_key
from gpuboot.mirror.serve import RunningRegistry, ServeSpec, start
from gpuboot.net import free_port  # noqa: F401 (the tests import it from here)
from tests.support.oci_layout import busybox_binaries, push, write_layout

ROOT = Path(__file__).resolve().parents[2]
IMAGE_CACHE = Path.home() / ".cache" / "gpuboot" / "test-images"
# Upstream name -> the id baked into the image's own layer.
LAB_IMAGES = {
    "nvcr.io/nvidia/lab/driver:570.158.01-ubuntu22.04": "driver",
    "nvcr.io/nvidia/lab/validator:v25.3.2": "validator",
    "registry.k8s.io/lab/pause:3.10.1": "pause",
}


@dataclass
class Upstream:
    registry: RunningRegistry
    releases_dir: Path
    release: str
    images: dict[str, str]

    @property
    def sources(self) -> list[str]:
        hosts = sorted({ref.split("/", 1)[0] for ref in self.images})
        return [f"--source={host}={self.registry.spec.url}/{host}" for host in hosts]


def signing_key(home: Path, email: str = "mirror@gpuboot.invalid") -> str:
    """A passphrase-less GnuPG signing key in its own home, as the mirror's operator keeps one."""
    home.mkdir(mode=0o700)
    new_signing_key(str(home), f"gpuboot lab mirror <{email}>", expires="1d")
    return email


def start_upstream(root: Path, images: dict[str, str] = LAB_IMAGES, padding: int = 0,
                   release: str = "lab-test", base: str = "k8s-1.36") -> Upstream:
    binaries = busybox_binaries(IMAGE_CACHE)
    layout = root / "layout"
    for index, image_id in enumerate(images.values()):
        write_layout(layout, f"t{index}", binaries, image_id, padding)
    registry = start(ServeSpec(root / "upstream", f"127.0.0.1:{free_port()}", tls=False))
    for index, ref in enumerate(images):
        push(layout, f"t{index}", f"{registry.spec.listen}/{ref}")
    releases = root / "releases"
    releases.mkdir(parents=True, exist_ok=True)
    write_release(releases / f"{release}.yml", release, list(images), base=base)
    return Upstream(registry, releases, release, images)


def write_release(path: Path, name: str, images: list[str], charts: dict | None = None,
                  base: str = "k8s-1.36") -> None:
    """A release file like the shipped `base`, with only the given images and charts."""
    text = (ROOT / "mirror" / "releases" / f"{base}.yml").read_text()
    text = text.replace(f"name: {base}", f"name: {name}")
    listed = "".join(f"      - {ref}\n" for ref in images)
    text = re.sub(r"  images:\n(?:    .*\n)*?  # Images the operators",
                  f"  images:\n    lab:\n{listed}  # Images the operators", text)
    # the list's items, one line or several (`    - key: ...` then `      key: ...`)
    text = re.sub(r"  runtime_images:\n(?:    (?:- |  ).*\n)+", "  runtime_images: []\n", text)
    text = re.sub(r"    (?:crd_)?chart: \{.*\}\n", "", text)
    if charts:
        text += "  lab_charts:\n    version: \"1\"\n    chart: " + repr(charts).replace("'", '"') + "\n"
    path.write_text(text)
