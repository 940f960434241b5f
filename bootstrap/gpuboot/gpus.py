"""The GPU models gpuboot knows (mirror/gpus.yml): PCI ids and MIG geometry."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import yaml

from gpuboot import content


@dataclass(frozen=True)
class MigProfile:
    name: str
    compute: int
    memory: int
    most: int  # instances of this profile one GPU can hold


@dataclass(frozen=True)
class MigGeometry:
    compute_slices: int
    memory_slices: int
    profiles: dict[str, MigProfile]
    balanced: dict[str, int]

    def misfit(self, instances: dict[str, int]) -> str | None:
        """Why these instances do not fit on one GPU, or None when they do."""
        unknown = [name for name in instances if name not in self.profiles]
        if unknown:
            return f"profile {', '.join(unknown)} does not exist on this GPU (its profiles: {', '.join(self.profiles)})"
        for name, count in instances.items():
            if count > self.profiles[name].most:
                return f"{count} x {name} is more than the {self.profiles[name].most} one GPU holds"
        compute = sum(self.profiles[n].compute * c for n, c in instances.items())
        memory = sum(self.profiles[n].memory * c for n, c in instances.items())
        if compute > self.compute_slices or memory > self.memory_slices:
            return (f"{_shown(instances)} needs {compute} compute and {memory} memory slices; "
                    f"one GPU has {self.compute_slices} and {self.memory_slices}")
        return None


# GPU Feature Discovery's `nvidia.com/gpu.family` where it differs from the table's architecture.
GFD_FAMILIES = {"ada": "ada-lovelace"}


@dataclass(frozen=True)
class GpuModel:
    name: str
    product: str
    pci_devices: tuple[str, ...]
    architecture: str
    mig: MigGeometry | None
    gfd_product: str | None = None

    @property
    def gfd_family(self) -> str:
        return GFD_FAMILIES.get(self.architecture, self.architecture)

    def as_data(self) -> dict:
        """What preflight's module needs to recognise the model on a node."""
        return {"product": self.product, "pci_devices": list(self.pci_devices),
                "architecture": self.architecture, "mig": self.mig is not None}


def _shown(instances: dict[str, int]) -> str:
    return " + ".join(f"{count} x {name}" for name, count in instances.items())


@cache
def catalog() -> dict[str, GpuModel]:
    data = yaml.safe_load((content.content_dir() / "mirror" / "gpus.yml").read_text())
    geometries = {
        key: MigGeometry(body["compute_slices"], body["memory_slices"],
                         {name: MigProfile(name, *numbers) for name, numbers in body["profiles"].items()},
                         dict(body["balanced"]))
        for key, body in data["mig_geometries"].items()}
    return {name: GpuModel(name, body["product"], tuple(body["pci_devices"]), body["architecture"],
                           None if body["mig"] == "none" else geometries[body["mig"]], body.get("gfd_product"))
            for name, body in data["models"].items()}


def catalog_data() -> dict[str, dict]:
    return {name: model.as_data() for name, model in catalog().items()}
