"""Where a stretch of the suite's CPU goes, by program: the kernel's process accounting (BSD
acct, version 3 records) summed by command name. Every process is counted when it exits, the
short ones too (Ansible's modules on the nodes, ssh, kubectl), which a sampler misses; the lab
nodes' daemons (etcd, kube-apiserver, kubelet) are counted when their lab is taken down.

    .venv/bin/python -m tests.bench.cpu_by_program --on /var/tmp/pacct     # as root
    ... run the tests ...
    .venv/bin/python -m tests.bench.cpu_by_program --off
    .venv/bin/python -m tests.bench.cpu_by_program /var/tmp/pacct [--from BYTES] [--to BYTES]

--from and --to take the file's size at two moments (`stat -c %s`), to sum what exited
between them. A process's own CPU only: a parent's figure holds none of its children's.
Not a test."""
from __future__ import annotations

import argparse
import ctypes
import os
import struct
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (float), utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16].
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
VERSION = 3
AHZ = 100  # the ticks the kernel's accounting counts in


def comp_t(value: int) -> int:
    """The kernel's 16-bit counter: a 13-bit mantissa and a base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


@dataclass(frozen=True)
class Exited:
    command: str
    cpu: float  # seconds, user and system
    elapsed: float  # seconds
    pid: int
    ppid: int


def records(data: bytes) -> list[Exited]:
    if len(data) % RECORD.size:
        raise ValueError(f"{len(data)} bytes is not a whole number of {RECORD.size}-byte records")
    found = []
    for offset in range(0, len(data), RECORD.size):
        (_flag, version, _tty, _exit, _uid, _gid, pid, ppid, _btime, etime,
         utime, stime, *_rest, comm) = RECORD.unpack_from(data, offset)
        if version & 0x7F != VERSION:
            raise ValueError(f"record at byte {offset} is version {version & 0x7F}, not {VERSION}")
        found.append(Exited(comm.split(b"\0", 1)[0].decode(errors="replace"),
                            (comp_t(utime) + comp_t(stime)) / AHZ, etime / AHZ, pid, ppid))
    return found


@dataclass
class Program:
    command: str
    cpu: float = 0.0
    processes: int = 0


def by_program(exited: list[Exited]) -> list[Program]:
    """Each command's CPU and count of processes, the costliest first."""
    totals: dict[str, Program] = defaultdict(lambda: Program(""))
    for item in exited:
        program = totals[item.command]
        program.command = item.command
        program.cpu += item.cpu
        program.processes += 1
    return sorted(totals.values(), key=lambda p: (-p.cpu, p.command))


def table(programs: list[Program], shown: int = 25) -> str:
    total = sum(p.cpu for p in programs) or 1.0
    lines = [f"{'program':<18}{'CPU s':>10}{'share':>8}{'processes':>11}"]
    for program in programs[:shown]:
        lines.append(f"{program.command:<18}{program.cpu:>10.0f}{program.cpu / total:>8.1%}{program.processes:>11}")
    rest = programs[shown:]
    if rest:
        lines.append(f"{'(' + str(len(rest)) + ' more)':<18}{sum(p.cpu for p in rest):>10.0f}"
                     f"{sum(p.cpu for p in rest) / total:>8.1%}{sum(p.processes for p in rest):>11}")
    lines.append(f"{'all':<18}{total:>10.0f}{1:>8.1%}{sum(p.processes for p in programs):>11}")
    return "\n".join(lines)


def switch(path: Path | None) -> None:
    """Turn the kernel's accounting on into PATH, or off (None): acct(2), root only."""
    if path is not None:
        path.touch()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(str(path).encode() if path is not None else None) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", type=Path)
    parser.add_argument("--on", type=Path, help="start accounting into this file")
    parser.add_argument("--off", action="store_true", help="stop accounting")
    parser.add_argument("--from", dest="start", type=int, default=0, help="the file's size when the stretch began")
    parser.add_argument("--to", dest="end", type=int, default=None, help="the file's size when it ended")
    args = parser.parse_args(argv)
    if args.on or args.off:
        switch(args.on)
        return 0
    if args.file is None:
        parser.error("give the accounting file, or --on FILE / --off")
    data = args.file.read_bytes()[args.start:args.end]
    print(table(by_program(records(data))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
