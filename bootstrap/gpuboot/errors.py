"""Typed errors. Library code raises these; only the CLI turns them into exit codes."""
from __future__ import annotations

from dataclasses import dataclass, field


class GpubootError(Exception):
    """A problem a person can act on: what went wrong, where, and how to fix it."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  fix: {self.hint}"


def dotted(*parts) -> str:
    """A setting's path as every message writes it: keys joined by dots, list positions in
    brackets (gpuboot.tenants[1].quota.gpu); empty parts left out."""
    out = ""
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif part != "" and part is not None:
            out += f".{part}" if out else str(part)
    return out


@dataclass(frozen=True)
class Problem:
    """One located problem in an input file."""

    file: str
    line: int | None
    path: str
    message: str
    fix: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where} {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        return f"{text} (fix: {self.fix})" if self.fix else text


class InventoryError(GpubootError):
    """The inventory is invalid. Carries every problem found, not only the first."""

    exit_code = 2

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        head = f"inventory is invalid ({count} problem{'s' if count != 1 else ''})"
        super().__init__(head + "\n" + "\n".join(f"  {p}" for p in self.problems))


class UsageError(GpubootError):
    """A command-line choice that cannot work (unknown phase, conflicting flags)."""

    exit_code = 2


class LockedError(GpubootError):
    """Another gpuboot run holds the cluster's lock."""

    exit_code = 3


class PhaseFailed(GpubootError):
    """A phase ended with failed or unreachable hosts."""

    exit_code = 4


class Interrupted(GpubootError):
    """The operator pressed Ctrl-C; the run stopped cleanly."""

    exit_code = 130


class MatrixError(GpubootError):
    """The version matrix is missing or malformed."""

    exit_code = 2


@dataclass
class ProblemList:
    """Collects problems while validating, so all of them are reported at once."""

    items: list[Problem] = field(default_factory=list)

    def add(self, file: str, line: int | None, path: str, message: str, fix: str | None = None) -> None:
        self.items.append(Problem(file, line, path, message, fix))

    def raise_if_any(self) -> None:
        if self.items:
            raise InventoryError(self.items)


class MirrorError(GpubootError):
    """The air-gap mirror or a bundle cannot be planned, pulled, imported or verified."""

    exit_code = 6


class UpgradeRefused(GpubootError):
    """An upgrade that must not start (path, skew, health, mirror): nothing was changed."""

    exit_code = 7


class GitOpsError(GpubootError):
    """The GitOps repository cannot be read (no access, wrong host key), or differs when asked
    to fail on a difference (`gitops diff --exit-code`)."""

    exit_code = 1
