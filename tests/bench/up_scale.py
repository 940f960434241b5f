"""Benchmark: `gpuboot up` through node preparation (preflight to kube_packages) on lab clusters
of several sizes (3 control planes, the rest workers; kind-like nodes, air-gapped behind the
lab mirror with the lab-built Kubernetes packages, as README's main command), timing the
first run, a plain re-run and a `--force` re-run of every phase.

Per size: wall seconds and per phase, changed tasks, host-tasks (every task's result on every
host in the phases' playbooks; the probe and record runs report no task events), CPU seconds of the control machine (everything the
run starts: gpuboot, ansible-playbook, its workers and the ssh masters, which leave the process
tree and so are counted through a cgroup of their own; gpuboot's own process apart), the lab
nodes' own CPU seconds (their containers' cgroups: on this machine they share its cores), the
largest peak RSS of one process; across sizes: the marginal wall and control CPU seconds per
extra node. Not a test: run it by hand on an otherwise idle machine and record the figures in
docs/benchmarks.md.

    .venv/bin/python -m tests.bench.up_scale --nodes 5 20 50 [--out result.json] [--skip-forced]
        [--lever mitogen] [--ansible ANSIBLE_STRATEGY=free ...] [--executors 2] [--to preflight]

`--to PHASE` stops at an earlier phase: `--to preflight` measures what comparing the nodes
costs without preparing them.

`--executors N` is the split run (docs/executors.md): N executor containers on the lab's network
(the lab's node image with sshd, this venv and its Python mounted read-only at the same paths,
as an execution node would have them installed) are named in the inventory's
gpuboot.executors, so the node-local phases run there; their CPU is reported apart from the
control machine's and the nodes'.

A lever is measured without changing the product: `--ansible` passes Ansible settings through
the environment (gpuboot hands ANSIBLE_* on to its playbooks), and `--lever mitogen` runs
every playbook under mitogen's linear strategy (`pip install mitogen` into the venv first).

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
from collections.abc import Iterator
from contextlib import contextmanager
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


class ControlCgroup:
    """A cgroup of its own for one measured run, so that its CPU counts every process the run
    starts: ssh's ControlPersist masters detach from the process tree (getrusage never sees
    them) but stay in the cgroup they were born in. None where no cgroup can be made."""

    V1 = Path("/sys/fs/cgroup/cpuacct")
    V2 = Path("/sys/fs/cgroup")

    def __init__(self, name: str):
        if (self.V1 / "cpuacct.usage").is_file():
            self.path, self.v2 = self.V1 / name, False
        elif (self.V2 / "cgroup.controllers").is_file():
            self.path, self.v2 = self.V2 / name, True
        else:
            raise OSError("no cpuacct (v1) or unified (v2) cgroup hierarchy")
        self.path.mkdir()

    def enter(self) -> None:
        """preexec_fn of the measured child: it and all it starts belong to this cgroup."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_seconds(self) -> float:
        if self.v2:
            stat = (self.path / "cpu.stat").read_text().splitlines()
            return int(next(line.split()[1] for line in stat if line.startswith("usage_usec"))) / 1e6
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def close(self) -> None:
        """Hands what still runs (idle ssh masters) back to the parent cgroup, then removes it."""
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (self.path.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # it ended meanwhile
        self.path.rmdir()


def control_cgroup() -> ControlCgroup | None:
    try:
        return ControlCgroup(f"gpuboot-bench-{os.getpid()}-{time.monotonic_ns()}")
    except OSError as exc:
        print(f"control CPU from getrusage only (no cgroup: {exc}); ssh masters are not counted",
              file=sys.stderr)
        return None


# The events at which the control machine's CPU is read, to say which step of a run spent it.
MARKS = ("RunStarted", "PhaseStarted", "PhaseSkipped", "PhaseFinished", "RunFinished")


def run_measured(command: list[str], **kwargs) -> tuple[subprocess.CompletedProcess[str], float | None, list]:
    """`command`'s result, the CPU-seconds of everything it started, counted in a cgroup of its
    own (None where none can be made), and that count read at each of its run's MARKS events as
    they stream ([event, phase, seconds], for the profile)."""
    cgroup = control_cgroup()
    marks: list = []
    try:
        with tempfile.TemporaryFile("w+") as errors:
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True,
                                     preexec_fn=cgroup.enter if cgroup else None, **kwargs)
            lines = []
            for line in child.stdout:
                lines.append(line)
                if cgroup and line.startswith("{"):
                    event = json.loads(line)
                    if event["event"] in MARKS:
                        marks.append([event["event"], event.get("phase"), cgroup.cpu_seconds()])
            child.wait()
            errors.seek(0)
            proc = subprocess.CompletedProcess(command, child.returncode, "".join(lines), errors.read())
        return proc, cgroup.cpu_seconds() if cgroup else None, marks
    finally:
        if cgroup:
            cgroup.close()


def cpu_by_step(marks: list, total: float | None) -> dict[str, float]:
    """The control machine's CPU-seconds by step of one run: `start` (reading and checking the
    inventory, to RunStarted), `lock and probe` (gpuboot's state run on the hosts, to the plan's
    first phase event), each phase that ran, `between phases`, `record and unlock` (the state run
    at the end, to RunFinished) and `exit`."""
    if not marks or total is None:
        return {}
    profile: dict[str, float] = {"start": marks[0][2]}
    previous, started, planned = marks[0][2], None, False
    for event, phase, seconds in marks[1:]:
        if event == "RunFinished":
            step = "record and unlock"
        elif not planned:
            step, planned = "lock and probe", True
        elif event == "PhaseFinished" and phase == started:
            step = phase
        else:
            step = "between phases"
        profile[step] = profile.get(step, 0.0) + seconds - previous
        previous, started = seconds, (phase if event == "PhaseStarted" else None)
    profile["exit"] = total - previous
    return {step: round(cpu, 1) for step, cpu in profile.items()}


def container_cpu_seconds(name: str) -> float | None:
    """One podman container's CPU-seconds so far, from its cgroup (v1 or v2)."""
    found = subprocess.run(["podman", "inspect", "--format", "{{.State.CgroupPath}}", name],
                           capture_output=True, text=True)
    path = found.stdout.strip().lstrip("/")
    if found.returncode != 0 or not path:
        return None
    v1, v2 = Path("/sys/fs/cgroup/cpuacct") / path / "cpuacct.usage", Path("/sys/fs/cgroup") / path / "cpu.stat"
    if v1.is_file():
        return int(v1.read_text()) / 1e9
    if v2.is_file():
        return int(next(line.split()[1] for line in v2.read_text().splitlines() if line.startswith("usage_usec"))) / 1e6
    return None


def executors_cpu_seconds(containers: list[str]) -> float | None:
    readings = [container_cpu_seconds(c) for c in containers]
    return None if not containers or None in readings else sum(readings)


def start_executors(count: int, inventory: Path, workdir: Path) -> tuple[Path, list[str]]:
    """`count` executor containers beside the bench lab (tests/integration/lab_executors.py):
    the inventory that names them in gpuboot.executors, and their containers."""
    from gpuboot_lab.cluster import Lab
    from tests.integration import lab_executors
    started = lab_executors.start(Lab(ROOT / ".gpuboot" / "_lab" / LAB, log=lambda message: None),
                                  count, inventory, workdir)
    return started.inventory, started.containers


def host_tasks(events: list[dict]) -> int:
    """Every task's result on every host, over the phases' playbooks."""
    return sum(counts["ok"] + counts["failed"] + counts["skipped"] + counts["unreachable"]
               for e in events if e["event"] == "PlaybookStats" for counts in e["hosts"].values())


def timed_up(inventory: Path, env: dict[str, str], *extra: str, executors: tuple[str, ...] = (),
             to: str = NODE_PREP[-1]) -> dict:
    executors_before = executors_cpu_seconds(list(executors))
    nodes_before = node_cpu_seconds()
    started = time.monotonic()
    proc, control_cpu, marks = run_measured([sys.executable, "-c", MEASURED, "up", str(inventory), "--to", to,
                                      "--output", "json", *extra], cwd=ROOT, env=env)
    wall = time.monotonic() - started
    nodes_after = node_cpu_seconds()
    executors_after = executors_cpu_seconds(list(executors))
    executors_cpu = (executors_after - executors_before) if executors_before is not None else None
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    usage = json.loads(proc.stderr.strip().splitlines()[-1])
    if proc.returncode != 0:
        raise SystemExit(f"up {' '.join(extra)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    phases = {e["phase"]: {"seconds": round(e["seconds"], 1), "changed": e["changed"]}
              for e in events if e["event"] == "PhaseFinished"}
    in_phases = sum(p["seconds"] for p in phases.values())
    if control_cpu is None:
        control_cpu = usage["gpuboot_cpu"] + usage["ansible_cpu"]
    return {"wall": round(wall, 1), "phases": phases,
            "skipped": [e["phase"] for e in events if e["event"] == "PhaseSkipped"],
            "changed": sum(p["changed"] for p in phases.values()),
            "host_tasks": host_tasks(events),
            "outside_phases": round(wall - in_phases, 1),
            "control_cpu": round(control_cpu, 1),
            "control_cpu_by_step": cpu_by_step(marks, control_cpu),
            "gpuboot_cpu": round(usage["gpuboot_cpu"], 1), "ansible_cpu": round(usage["ansible_cpu"], 1),
            "gpuboot_cpu_share": round(usage["gpuboot_cpu"] / wall, 3),
            "gpuboot_peak_mib": usage["gpuboot_peak_mib"], "child_peak_mib": usage["child_peak_mib"],
            # The executors are containers too: the nodes' figure leaves their CPU out.
            "nodes_cpu": (round(nodes_after - nodes_before - (executors_cpu or 0), 1)
                          if nodes_before is not None else None),
            "executors_cpu": round(executors_cpu, 1) if executors_cpu is not None else None,
            "on_executors": [e["phase"] for e in events
                             if e["event"] == "PhaseStarted" and "on the executors" in e.get("reason", "")]}


def mitogen_settings() -> dict[str, str]:
    """The Ansible settings that run every play under mitogen's linear strategy."""
    try:
        import ansible_mitogen
    except ImportError:
        raise SystemExit("mitogen is not installed in this venv (pip install mitogen)") from None
    return {"ANSIBLE_STRATEGY_PLUGINS": str(Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"),
            "ANSIBLE_STRATEGY": "mitogen_linear"}


def lever_environment(lever: str | None, settings: list[str]) -> dict[str, str]:
    """The environment gpuboot runs in: this one, plus the Ansible settings of the lever measured."""
    env = dict(os.environ)
    if lever == "mitogen":
        env.update(mitogen_settings())
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key.startswith("ANSIBLE_"):
            raise SystemExit(f"--ansible {setting!r}: give ANSIBLE_<SETTING>=<value>")
        env[key] = value
    return env


def bundle(version: str) -> Path:
    path = ROOT / ".gpuboot" / "_lab" / f"bundle-{version}"
    if not (path / "bundle.json").is_file():
        gpuboot("lab", "kubernetes", "build", "--version", version)
        gpuboot("lab", "kubernetes", "bundle", "--version", version, "--out", str(path))
    return path


@contextmanager
def lab_cluster(nodes: int, subnet: str, packages: Path, workdir: Path) -> Iterator[tuple[Path, float]]:
    """A fresh lab of `nodes` (3 control planes, the rest workers) behind the lab mirror holding
    `packages`: its inventory and the seconds the lab took to start. Taken down on leaving."""
    inventory = workdir / f"inventory-{nodes}.yml"
    gpuboot("lab", "down", "--name", LAB, check=False)
    started = time.monotonic()
    gpuboot("lab", "up", "--name", LAB, "--flavour", "kubernetes", "--control-planes", "3",
            "--workers", str(nodes - 3), "--gpu-workers", "0", "--subnet", subnet, "--release", RELEASE,
            "--inventory", str(inventory))
    lab_seconds = time.monotonic() - started
    try:
        gpuboot("lab", "mirror", str(packages), "--name", LAB)
        yield inventory, lab_seconds
    finally:
        gpuboot("lab", "down", "--name", LAB, check=False)


def one_size(nodes: int, subnet: str, packages: Path, workdir: Path, env: dict[str, str],
             forced: bool = True, executors: int = 0, to: str = NODE_PREP[-1]) -> dict:
    with lab_cluster(nodes, subnet, packages, workdir) as (inventory, lab_seconds):
        result = {"nodes": nodes, "lab_up_seconds": round(lab_seconds, 1), "executors": executors}
        containers: list[str] = []
        if executors:
            inventory, containers = start_executors(executors, inventory, workdir)
        on = tuple(containers)
        result["first"] = timed_up(inventory, env, executors=on, to=to)
        if executors and result["first"]["on_executors"] != list(NODE_PREP[1:NODE_PREP.index(to) + 1]):
            raise SystemExit(f"the split run ran {result['first']['on_executors']} on the executors")
        result["rerun"] = timed_up(inventory, env, executors=on, to=to)
        first = result["first"]["wall"]
        result["rerun_share"] = round(result["rerun"]["wall"] / first, 3)
        if forced:
            result["forced"] = timed_up(inventory, env, "--force", executors=on, to=to)
            result["forced_share"] = round(result["forced"]["wall"] / first, 3)
        result["cpu_seconds_per_node"] = round(result["first"]["control_cpu"] / nodes, 2)
        result["host_tasks_per_node"] = round(result["first"]["host_tasks"] / nodes, 1)
        if result["first"]["nodes_cpu"] is not None:
            result["node_cpu_seconds_per_node"] = round(result["first"]["nodes_cpu"] / nodes, 2)
        if result["first"]["executors_cpu"] is not None:
            result["executor_cpu_seconds_per_node"] = round(result["first"]["executors_cpu"] / nodes, 2)
        return result


def commit() -> str:
    """The commit measured, marked when the working tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "bootstrap", "playbooks", "roles", "mirror",
                            "ansible.cfg", "pyproject.toml", "requirements.lock"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + (" with uncommitted product changes" if dirty else "")


def markdown(summary: dict, command: str) -> str:
    """The rows docs/benchmarks.md takes, with the date, commit, machine and command."""
    lines = [f"{time.strftime('%Y-%m-%d')}, commit {summary['commit']}, {summary['machine']}: `{command}`", "",
             "| nodes | first `up` | changed | host-tasks per node | control CPU | per node | nodes' CPU per node "
             "| plain re-run | peak RSS (gpuboot / one child) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for size in summary["sizes"]:
        first, rerun = size["first"], size["rerun"]
        on_executors = (f" (+ {size['executor_cpu_seconds_per_node']} s on {size['executors']} executors)"
                        if size.get("executor_cpu_seconds_per_node") is not None else "")
        lines.append(
            f"| {size['nodes']} | {first['wall']:,.0f} s | {first['changed']} | {size['host_tasks_per_node']} "
            f"| {first['control_cpu']:,.1f} s | {size['cpu_seconds_per_node']} s "
            f"| {size.get('node_cpu_seconds_per_node', '-')} s{on_executors} "
            f"| {rerun['wall']} s ({size['rerun_share']:.1%}), {rerun['changed']} changed "
            f"| {first['gpuboot_peak_mib']} / {first['child_peak_mib']} MiB |")
    steps = [(size["nodes"], size["first"].get("control_cpu_by_step")) for size in summary["sizes"]]
    if any(by_step for _, by_step in steps):
        lines += ["", "Control CPU of the first run by step:"]
        lines += [f"- {nodes} nodes: " + ", ".join(f"{step} {cpu} s" for step, cpu in by_step.items())
                  for nodes, by_step in steps if by_step]
    if "marginal_control_cpu_per_node" in summary:
        lines += ["", f"Per extra node: {summary['marginal_control_cpu_per_node']} control CPU-seconds, "
                      f"{summary['marginal_host_tasks_per_node']} host-tasks, "
                      f"{summary['marginal_seconds_per_node']} s of wall."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[5, 20, 50])
    parser.add_argument("--subnet", default="10.213.60.0/24")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", action="store_true", help="also print the rows for docs/benchmarks.md")
    parser.add_argument("--skip-forced", action="store_true", help="no `--force` re-run (it takes about half the first run)")
    parser.add_argument("--lever", choices=["mitogen"], help="run every playbook under this strategy")
    parser.add_argument("--ansible", action="append", default=[], metavar="ANSIBLE_X=VALUE",
                        help="an Ansible setting for every playbook (repeat for more)")
    parser.add_argument("--executors", type=int, default=0, metavar="N",
                        help="the split run: the node-local phases on N executor containers")
    parser.add_argument("--to", choices=NODE_PREP, default=NODE_PREP[-1],
                        help="the last phase measured (preflight alone: what comparing the nodes costs)")
    args = parser.parse_args()
    if min(args.nodes) < 4:
        raise SystemExit("--nodes: at least 4 (3 control planes and a worker)")
    os.environ.setdefault("ANSIBLE_FORCE_COLOR", "0")
    env = lever_environment(args.lever, args.ansible)
    from gpuboot import matrix
    packages = bundle(matrix.load(RELEASE).kubernetes.version)
    workdir = Path(tempfile.mkdtemp(prefix="gpuboot-up-scale-"))
    results = []
    for nodes in sorted(args.nodes):
        results.append(one_size(nodes, args.subnet, packages, workdir, env, forced=not args.skip_forced,
                                executors=args.executors, to=args.to))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    summary = {"machine": f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') >> 30} GiB",
               "commit": commit(),
               "lever": args.lever, "ansible": args.ansible, "executors": args.executors, "sizes": results}
    if len(results) > 1:
        small, large = results[0], results[-1]
        extra = large["nodes"] - small["nodes"]
        summary["marginal_seconds_per_node"] = round((large["first"]["wall"] - small["first"]["wall"]) / extra, 2)
        summary["marginal_seconds_per_node_by_phase"] = {
            phase: round((large["first"]["phases"][phase]["seconds"] - small["first"]["phases"][phase]["seconds"])
                         / extra, 2)
            for phase in NODE_PREP if phase in large["first"]["phases"] and phase in small["first"]["phases"]}
        summary["marginal_control_cpu_per_node"] = round(
            (large["first"]["control_cpu"] - small["first"]["control_cpu"]) / extra, 2)
        summary["marginal_host_tasks_per_node"] = round(
            (large["first"]["host_tasks"] - small["first"]["host_tasks"]) / extra, 1)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.markdown:
        print("\n" + markdown(summary, "python -m tests.bench.up_scale " + " ".join(sys.argv[1:])))
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
