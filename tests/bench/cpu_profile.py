"""Where the control machine's CPU goes in `gpuboot up` through node preparation: a sampling
profile (py-spy, every Python process of the run: gpuboot, ansible-playbook, its forked
workers) of a fresh lab cluster's first run, summed into what the work is for.

    .venv/bin/python -m tests.bench.cpu_profile --nodes 10 [--keep profile.txt]
    .venv/bin/python -m tests.bench.cpu_profile --summarise profile.txt

py-spy is not a dependency of gpuboot: `pip install py-spy` into the venv first. It samples
only threads that hold the GIL (`--gil`), so a process sleeping between polls is not counted,
and ssh (not Python) is not in it: up_scale's cgroup figure counts both. The profile's own
sampling costs CPU too, so it gives shares, not the benchmark's CPU-seconds. Not a test."""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from tests.bench.up_scale import GPUBOOT, LAB, NODE_PREP, RELEASE, ROOT, bundle, lab_cluster

RATE = 97  # samples per second, off the 100 Hz of timers so it does not beat with them

# (category, frames that mark it), first match wins; a frame matches on its qualified name.
WORKER = (
    ("worker: building the module payload (module_utils scan, AnsiballZ)",
     ("modify_module", "_find_module_utils", "recursive_finder", "_configure_module")),
    ("worker: ssh round trips (exec, put, fetch)",
     ("Connection.exec_command", "Connection.put_file", "Connection.fetch_file", "Connection._bare_run")),
    ("worker: templating the task for the host (args, when, loops)",
     ("post_validate", "TemplateEngine", "_evaluate_conditional", "Templar.", "Environment.compile")),
    ("worker: action plugins' own work (copy's stat and diff, results)", ("ActionModule.run", "ActionBase.")),
)
# With fewer forks than hosts, Ansible's task queue looks for a free worker every 0.1 ms
# (is_alive on each, then sleep) for as long as the busy ones run.
WAITING_FOR_A_WORKER = "main: waiting for a free worker (more hosts than forks)"
MAIN = (
    ("main: forking a worker per host per task", ("Popen._launch", "WorkerProcess.start")),
    ("main: variables of each host for each task", ("VariableManager.get_vars",)),
    ("main: results and facts back from the workers", ("_process_pending_results", "clean_facts")),
    ("main: callbacks (ansible-runner's event records)", ("send_callback",)),
    ("main: loading playbooks, roles and plugins", ("_find_and_load", "Play.load", "Role.load", "PluginLoader",
                                                  "get_single_data", "load_list_of_tasks")),
)


def _matches(frames: list[str], marks: tuple[str, ...]) -> bool:
    return any(mark in frame.split(" (", 1)[0] for frame in frames for mark in marks)


def category(frames: list[str]) -> str:
    """What one sampled stack was doing. A forked worker's stack starts with its parent's
    frames (fork copies them), so the worker is told by WorkerProcess.run, not by the process."""
    if not any(f.startswith("process ") and "ansible-playbook" in f for f in frames):
        return "gpuboot's own process"
    if _matches(frames, ("WorkerProcess.run",)):
        for name, marks in WORKER:
            if _matches(frames, marks):
                return name
        return "worker: the rest (start-up after fork, task executor)"
    if _matches(frames, ("_queue_task",)) and not _matches(frames, ("WorkerProcess.start",)):
        return WAITING_FOR_A_WORKER
    for name, marks in MAIN:
        if _matches(frames, marks):
            return name
    return "main: the rest (strategy loop, task queue)"


def summarise(raw: Path) -> list[tuple[str, float, float]]:
    """(category, seconds, share) from py-spy's raw output, largest first."""
    counts: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if stack and samples.isdigit():
            counts[category(stack.split(";"))] += int(samples)
    total = sum(counts.values()) or 1
    return [(name, n / RATE, n / total) for name, n in counts.most_common()]


def print_summary(rows: list[tuple[str, float, float]]) -> None:
    print(f"{'share':>6} {'seconds':>8}  what the CPU did")
    for name, seconds, share in rows:
        print(f"{share:6.1%} {seconds:8.1f}  {name}")
    print(f"{'':>6} {sum(r[1] for r in rows):8.1f}  sampled in all (Python holding the GIL)")


def py_spy() -> str:
    found = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def profile(nodes: int, subnet: str, raw: Path) -> None:
    from gpuboot import matrix
    packages = bundle(matrix.load(RELEASE).kubernetes.version)
    workdir = Path(tempfile.mkdtemp(prefix="gpuboot-cpu-profile-"))
    with lab_cluster(nodes, subnet, packages, workdir) as (inventory, _):
        proc = subprocess.run([py_spy(), "record", "--gil", "--subprocesses", "--rate", str(RATE), "--format", "raw",
                               "--output", str(raw), "--", str(GPUBOOT), "up", str(inventory), "--to", NODE_PREP[-1]],
                              cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"gpuboot up under py-spy failed ({proc.returncode}) on lab {LAB}:\n{proc.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--subnet", default="10.213.60.0/24")
    parser.add_argument("--keep", type=Path, help="keep py-spy's raw samples here")
    parser.add_argument("--summarise", type=Path, metavar="RAW", help="summarise samples kept before; run nothing")
    args = parser.parse_args(argv)
    if args.summarise:
        print_summary(summarise(args.summarise))
        return
    if args.nodes < 4:
        parser.error("--nodes: at least 4 (3 control planes and a worker)")
    raw = args.keep or Path(tempfile.mkdtemp(prefix="gpuboot-cpu-profile-")) / "profile.txt"
    profile(args.nodes, args.subnet, raw)
    print_summary(summarise(raw))


if __name__ == "__main__":
    main()
