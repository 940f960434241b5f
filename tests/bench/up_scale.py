"""Benchmark: `gpuboot up` through node preparation (preflight to kube_packages) on lab clusters
of several sizes (3 control planes, the rest workers; kind-like nodes, air-gapped behind the
lab mirror with the lab-built Kubernetes packages, as README's main command), timing the
first run, a plain re-run and a `--force` re-run of every phase.

Per size: wall seconds and per phase, changed tasks, CPU seconds of the control machine
(gpuboot's own process apart from Ansible's), the lab nodes' own CPU seconds (their
containers' cgroups: on this machine they share its cores), the largest peak RSS of one
process; across sizes: the marginal wall seconds per extra node. Not a test: run it by hand on an otherwise
idle machine and record the figures in README.

    .venv/bin/python -m tests.bench.up_scale --nodes 5 20 50 [--out result.json] [--skip-forced]

The benchmark runs the working tree: editing a role, a playbook or the release matrix while it
runs changes the phases' fingerprints, and the re-run then runs them again.
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

ROOT = Path(__file__).resolve().parents[2]
GPUBOOT = Path(sys.executable).parent / "gpuboot"
RELEASE = "k8s-1.36"
LAB = "bench"
NODE_PREP = ("preflight", "os_prep", "container_runtime", "kube_packages")
# Runs gpuboot in this child and reports its own CPU apart from its children's (Ansible).
MEASURED = """
import json, resource, sys
from gpuboot.cli.main import run
code = run(sys.argv[1:])
own = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"gpuboot_cpu": own.ru_utime + own.ru_stime, "ansible_cpu": kids.ru_utime + kids.ru_stime,
                  "gpuboot_peak_mib": own.ru_maxrss // 1024, "child_peak_mib": kids.ru_maxrss // 1024}),
      file=sys.stderr)
sys.exit(code)
"""


def gpuboot(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(GPUBOOT), *args], cwd=ROOT, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"gpuboot {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


# The lab nodes' own CPU (every podman container's cgroup, v1 or v2): on this machine the nodes
# share its cores with the control machine, where real nodes would each run on their own.
NODE_CGROUPS = (Path("/sys/fs/cgroup/cpuacct/libpod_parent/cpuacct.usage"),  # ns
                Path("/sys/fs/cgroup/libpod_parent/cpu.stat"), Path("/sys/fs/cgroup/machine.slice/cpu.stat"))


def node_cpu_seconds() -> float | None:
    for path in NODE_CGROUPS:
        if path.is_file():
            text = path.read_text()
            if path.name == "cpuacct.usage":
                return int(text) / 1e9
            return int(next(line.split()[1] for line in text.splitlines() if line.startswith("usage_usec"))) / 1e6
    return None


def timed_up(inventory: Path, *extra: str) -> dict:
    nodes_before = node_cpu_seconds()
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", MEASURED, "up", str(inventory), "--to", NODE_PREP[-1],
                           "--output", "json", *extra], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - started
    nodes_after = node_cpu_seconds()
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    usage = json.loads(proc.stderr.strip().splitlines()[-1])
    if proc.returncode != 0:
        raise SystemExit(f"up {' '.join(extra)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    phases = {e["phase"]: {"seconds": round(e["seconds"], 1), "changed": e["changed"]}
              for e in events if e["event"] == "PhaseFinished"}
    in_phases = sum(p["seconds"] for p in phases.values())
    return {"wall": round(wall, 1), "phases": phases,
            "skipped": [e["phase"] for e in events if e["event"] == "PhaseSkipped"],
            "changed": sum(p["changed"] for p in phases.values()),
            "outside_phases": round(wall - in_phases, 1),
            "gpuboot_cpu": round(usage["gpuboot_cpu"], 1), "ansible_cpu": round(usage["ansible_cpu"], 1),
            "gpuboot_cpu_share": round(usage["gpuboot_cpu"] / wall, 3),
            "gpuboot_peak_mib": usage["gpuboot_peak_mib"], "child_peak_mib": usage["child_peak_mib"],
            "nodes_cpu": round(nodes_after - nodes_before, 1) if nodes_before is not None else None}


def bundle(version: str) -> Path:
    path = ROOT / ".gpuboot" / "_lab" / f"bundle-{version}"
    if not (path / "bundle.json").is_file():
        gpuboot("lab", "kubernetes", "build", "--version", version)
        gpuboot("lab", "kubernetes", "bundle", "--version", version, "--out", str(path))
    return path


def one_size(nodes: int, subnet: str, packages: Path, workdir: Path, forced: bool = True) -> dict:
    inventory = workdir / f"inventory-{nodes}.yml"
    gpuboot("lab", "down", "--name", LAB, check=False)
    started = time.monotonic()
    gpuboot("lab", "up", "--name", LAB, "--flavour", "kubernetes", "--control-planes", "3",
            "--workers", str(nodes - 3), "--gpu-workers", "0", "--subnet", subnet, "--release", RELEASE,
            "--inventory", str(inventory))
    lab_seconds = time.monotonic() - started
    try:
        gpuboot("lab", "mirror", str(packages), "--name", LAB)
        result = {"nodes": nodes, "lab_up_seconds": round(lab_seconds, 1)}
        result["first"] = timed_up(inventory)
        result["rerun"] = timed_up(inventory)
        first = result["first"]["wall"]
        result["rerun_share"] = round(result["rerun"]["wall"] / first, 3)
        if forced:
            result["forced"] = timed_up(inventory, "--force")
            result["forced_share"] = round(result["forced"]["wall"] / first, 3)
        result["cpu_seconds_per_node"] = round(
            (result["first"]["gpuboot_cpu"] + result["first"]["ansible_cpu"]) / nodes, 2)
        if result["first"]["nodes_cpu"] is not None:
            result["node_cpu_seconds_per_node"] = round(result["first"]["nodes_cpu"] / nodes, 2)
        return result
    finally:
        gpuboot("lab", "down", "--name", LAB, check=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[5, 20, 50])
    parser.add_argument("--subnet", default="10.213.60.0/24")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip-forced", action="store_true", help="no `--force` re-run (it takes about half the first run)")
    args = parser.parse_args()
    if min(args.nodes) < 4:
        raise SystemExit("--nodes: at least 4 (3 control planes and a worker)")
    os.environ.setdefault("ANSIBLE_FORCE_COLOR", "0")
    from gpuboot import matrix
    packages = bundle(matrix.load(RELEASE).kubernetes.version)
    workdir = Path(tempfile.mkdtemp(prefix="gpuboot-up-scale-"))
    results = []
    for nodes in sorted(args.nodes):
        results.append(one_size(nodes, args.subnet, packages, workdir, forced=not args.skip_forced))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    summary = {"machine": f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') >> 30} GiB",
               "sizes": results}
    if len(results) > 1:
        small, large = results[0], results[-1]
        extra = large["nodes"] - small["nodes"]
        summary["marginal_seconds_per_node"] = round((large["first"]["wall"] - small["first"]["wall"]) / extra, 2)
        summary["marginal_seconds_per_node_by_phase"] = {
            phase: round((large["first"]["phases"][phase]["seconds"] - small["first"]["phases"][phase]["seconds"])
                         / extra, 2)
            for phase in NODE_PREP if phase in large["first"]["phases"] and phase in small["first"]["phases"]}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
