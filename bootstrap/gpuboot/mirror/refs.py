"""Image references as upstream writes them, and where each lives in the mirror.

The mirror keeps every image under its upstream registry's name as the first path part
(`<mirror>/nvcr.io/nvidia/driver`): the layout containerd's hosts.toml asks for with
`override_path`, so nodes pull `nvcr.io/nvidia/driver:TAG` unchanged."""
from __future__ import annotations

import re
from dataclasses import dataclass

from gpuboot.errors import MirrorError

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
PATH_PART = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")


@dataclass(frozen=True, order=True)
class ImageRef:
    registry: str
    repository: str
    tag: str
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def mirror_repository(self) -> str:
        """The repository path of this image inside the mirror."""
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        text = f"{self.name}:{self.tag}"
        return f"{text}@{self.digest}" if self.digest else text


def parse_image(text: str) -> ImageRef:
    """Parse `registry/path:tag[@sha256:...]`. The registry must be written out: an
    air-gap list that leaves it implicit is how docker.io images go missing."""
    rest, _, digest = text.partition("@")
    if digest and not DIGEST.match(digest):
        raise MirrorError(f"image {text!r}: {digest!r} is not a sha256 digest",
                          hint="write the digest as sha256:<64 hex characters>")
    slash = rest.find("/")
    registry = rest[:slash] if slash > 0 else ""
    if not registry or not ("." in registry or ":" in registry or registry == "localhost"):
        raise MirrorError(f"image {text!r} does not name its registry",
                          hint="write the full name, e.g. docker.io/library/redis:7 or nvcr.io/nvidia/driver:TAG")
    path_and_tag = rest[slash + 1:]
    colon = path_and_tag.rfind(":")
    if colon <= 0:
        raise MirrorError(f"image {text!r} has no tag", hint="add :TAG (a digest alone does not say what it is)")
    repository, tag = path_and_tag[:colon], path_and_tag[colon + 1:]
    if not TAG.match(tag) or not all(PATH_PART.match(p) for p in repository.split("/")):
        raise MirrorError(f"image {text!r} is not a valid reference",
                          hint="repository parts are lowercase letters, digits and . _ -; tags up to 128 characters")
    return ImageRef(registry, repository, tag, digest or None)
