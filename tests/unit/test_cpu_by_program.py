"""tests/bench/cpu_by_program.py reads the kernel's version-3 accounting records as the kernel
writes them (linux/acct.h: 64 bytes, times in comp_t ticks of 1/100 s)."""
from __future__ import annotations

import struct

import pytest

from tests.bench import cpu_by_program as bench


def record(comm: bytes, utime: int, stime: int, etime_ticks: float = 100.0, version: int = 3) -> bytes:
    return struct.pack("<BBHIIIIIIf8H16s", 0, version, 0, 0, 0, 0, 42, 1, 0, etime_ticks,
                       utime, stime, 0, 0, 0, 0, 0, 0, comm)


def test_a_record_is_the_kernels_64_bytes():
    assert bench.RECORD.size == 64


@pytest.mark.parametrize(("encoded", "ticks"), [(0, 0), (250, 250), (0x1FFF, 8191),
                                                (0x2000 | 1000, 8000), (0x4000 | 3, 192)])
def test_comp_t_is_a_13_bit_mantissa_and_a_base_8_exponent(encoded, ticks):
    assert bench.comp_t(encoded) == ticks


def test_programs_sum_user_and_system_time_by_command_the_costliest_first():
    data = (record(b"etcd", 0x2000 | 1000, 500) + record(b"ssh", 30, 20)
            + record(b"ssh", 40, 10) + record(b"kube-apiserver", 0x2000 | 1125, 1000, etime_ticks=360000.0))
    exited = bench.records(data)
    assert exited[3].elapsed == 3600.0 and exited[0].pid == 42
    programs = bench.by_program(exited)
    assert [(p.command, p.cpu, p.processes) for p in programs] == [
        ("kube-apiserver", 100.0, 1), ("etcd", 85.0, 1), ("ssh", 1.0, 2)]
    shown = bench.table(programs, shown=2)
    assert "(1 more)" in shown and shown.splitlines()[-1].split()[:2] == ["all", "186"]


def test_a_torn_or_foreign_file_is_refused():
    with pytest.raises(ValueError, match="whole number"):
        bench.records(record(b"ssh", 1, 1)[:60])
    with pytest.raises(ValueError, match="version 2"):
        bench.records(record(b"ssh", 1, 1, version=2))
