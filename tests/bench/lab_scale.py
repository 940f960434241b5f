"""Benchmark: how long N lab nodes take to come up and answer Ansible ping, and the memory
they use. Not a test: run it by hand and record the numbers in the issue.

    .venv/bin/python -m tests.bench.lab_scale --nodes 50
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuboot_lab.cluster import Lab, LabSpec

ROOT = Path(__file__).resolve().parents[2]


def used_memory_mib() -> int:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = lambda key: int(info[key].split()[0])  # noqa: E731
    return (kib("MemTotal") - kib("MemAvailable")) // 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--subnet", default="10.213.50.0/24")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpuboot-bench-"))
    lab = Lab(workdir / "_lab" / "bench", log=lambda m: print(m, file=sys.stderr))
    lab.down("bench")
    spec = LabSpec(name="bench", control_planes=3, workers=args.nodes - 4, gpu_workers=1, subnet=args.subnet)
    before = used_memory_mib()
    t0 = time.monotonic()
    try:
        lab.up(spec, workdir / "inventory.yml")
        up_seconds = time.monotonic() - t0
        settle = used_memory_mib()
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_HOST_KEY_CHECKING="True")
        t1 = time.monotonic()
        ping = subprocess.run([str(Path(sys.executable).parent / "ansible"), "-i", str(workdir / "inventory.yml"),
                               "all", "-m", "ansible.builtin.ping", "--forks", "50", "-o",
                               "--private-key", str(lab.dir / "id_ed25519"), "-u", "root"],
                              env=env, capture_output=True, text=True)
        ping_seconds = time.monotonic() - t1
        ok = sum(1 for line in ping.stdout.splitlines() if "SUCCESS" in line)
        print(json.dumps({"nodes": args.nodes, "up_seconds": round(up_seconds, 1),
                          "ping_seconds": round(ping_seconds, 1), "ping_ok": ok,
                          "memory_mib": settle - before,
                          "memory_mib_per_node": round((settle - before) / args.nodes, 1)}))
        if ok != args.nodes:
            print(ping.stdout[-2000:], ping.stderr[-2000:], file=sys.stderr)
            sys.exit(1)
    finally:
        lab.down("bench")


if __name__ == "__main__":
    main()
