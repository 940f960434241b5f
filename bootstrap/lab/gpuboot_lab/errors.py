"""The lab's one error type: a GpubootError, so the gpuboot CLI maps it to its exit code."""
from __future__ import annotations

from gpuboot.errors import GpubootError


class LabError(GpubootError):
    """The local lab cannot be created, used or removed."""

    exit_code = 5
