"""Benchmark: what one host-task costs the control machine, and which Ansible settings, which
runner and which Ansible release change it. No product phase runs: a lab of N nodes gets a
playbook of one fact gathering as gpuboot's (same subset) and K small tasks (a command, a
copy, a stat, in turn), run in a cgroup of its own so that ssh's masters count too.

    .venv/bin/python -m tests.bench.task_cost --nodes 10 --tasks 30 [--repeat 3]
        [--variant gpuboot plain no-fact-injection ...] [--core-venv /path/to/venv]

Per variant: control CPU-seconds per host-task = (CPU of the K-task run - CPU of the 0-task
run) / (K x N), the median of the repeats. The variants:
- gpuboot: gpuboot's ansible.cfg, through ansible-runner with an event handler, as gpuboot runs;
- plain: the same playbook and ansible.cfg, ansible-playbook alone (what ansible-runner adds);
- a named setting on top of gpuboot's (SETTINGS below);
- mitogen: gpuboot's, under mitogen's linear strategy (needs `pip install mitogen`);
- core: gpuboot's, with the ansible-playbook of another venv (--core-venv), e.g. an older
  ansible-core, to see what the release's templating costs.
Not a test: run it by hand on an otherwise idle machine."""
from __future__ import annotations

import argparse
import configparser
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.up_scale import ROOT, gpuboot, mitogen_settings, run_measured

LAB = "taskcost"
# Variants that change one ansible.cfg setting of gpuboot's: (section, key, value).
SETTINGS = {
    "no-fact-injection": ("defaults", "inject_facts_as_vars", "False"),
    "poll-10ms": ("defaults", "internal_poll_interval", "0.01"),
    "json-results": ("defaults", "callback_result_format", "json"),
    "no-pipelining": ("ssh_connection", "pipelining", "False"),
    "forks-5": ("defaults", "forks", "5"),
}
VARIANTS = ("gpuboot", "plain", *SETTINGS, "mitogen", "core")
GATHER_SUBSET = "!all,!min,distribution,virtual,hardware,network,kernel,platform"

RUNNER = """
import json, sys
import ansible_runner
count = [0]
def handle(event):
    count[0] += 1
    return True
r = ansible_runner.run(private_data_dir=sys.argv[1], playbook=sys.argv[2], inventory=sys.argv[3],
                       envvars=json.loads(sys.argv[4]), suppress_env_files=True, quiet=True, event_handler=handle)
sys.exit(0 if r.status == "successful" else 1)
"""


def playbook(path: Path, tasks: int, tag: str) -> Path:
    """One gathering as gpuboot's, then `tasks` tasks: a command, a copy, a stat, in turn."""
    kinds = [
        {"name": "read", "ansible.builtin.command": "/bin/true", "changed_when": False},
        {"name": "write", "ansible.builtin.copy": {"content": "{{ inventory_hostname }} {{ item_n }}\n",
                                                   "dest": f"/tmp/gpuboot-task-cost-{tag}-{{{{ item_n }}}}",
                                                   "mode": "0644"}},
        {"name": "look", "ansible.builtin.stat": {"path": "/etc/hostname"}},
    ]
    body = []
    for n in range(tasks):
        task = dict(kinds[n % len(kinds)])
        task["name"] = f"{task['name']} {n}"
        task["vars"] = {"item_n": n}
        body.append(task)
    play = [{"hosts": "all", "gather_facts": True, "gather_subset": GATHER_SUBSET.split(","), "tasks": body}]
    path.write_text(json.dumps(play))
    return path


def ansible_cfg(workdir: Path, variant: str) -> Path:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "ansible.cfg")
    parser["defaults"]["roles_path"] = str(ROOT / "roles")
    parser["defaults"]["library"] = str(ROOT / "playbooks" / "library")
    parser["defaults"]["module_utils"] = str(ROOT / "playbooks" / "module_utils")
    # As gpuboot's runs cache facts (ansible-runner's jsonfile fact_cache, a folder per run).
    parser["defaults"]["fact_caching"] = "jsonfile"
    parser["defaults"]["fact_caching_connection"] = str(workdir / "facts")
    if variant in SETTINGS:
        section, key, value = SETTINGS[variant]
        parser[section][key] = value
    path = workdir / f"ansible-{variant}.cfg"
    with path.open("w") as handle:
        parser.write(handle)
    return path


def measured_run(variant: str, book: Path, inventory: Path, workdir: Path, core_venv: Path | None) -> float:
    """Control CPU-seconds of one run of `book`, everything it started included."""
    env = {"ANSIBLE_CONFIG": str(ansible_cfg(workdir, variant)), "ANSIBLE_NOCOLOR": "1",
           # ansible-runner finds ansible-playbook on PATH: this venv's, as gpuboot does.
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(workdir / "cp" / f"{variant}-{time.monotonic_ns()}")}
    if variant == "mitogen":
        env.update(mitogen_settings())
    if variant == "plain":
        command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(book)]
    elif variant == "core":
        if core_venv is None:
            raise SystemExit("variant core: give --core-venv, a venv with another ansible-core")
        command = [str(core_venv / "bin" / "ansible-playbook"), "-i", str(inventory), str(book)]
    else:
        private = Path(tempfile.mkdtemp(prefix="runner-", dir=workdir))
        command = [sys.executable, "-c", RUNNER, str(private), str(book), str(inventory), json.dumps(env)]
    proc, cpu = run_measured(command, env={**os.environ, **env})
    if cpu is None:
        raise SystemExit("this benchmark needs a cgroup of its own (cgroup v1 cpuacct or v2) to count ssh")
    if proc.returncode != 0:
        raise SystemExit(f"{variant}: the playbook failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return cpu


def per_host_task(variant: str, nodes: int, tasks: int, repeat: int, inventory: Path, workdir: Path,
                  core_venv: Path | None) -> dict:
    samples = []
    for n in range(repeat):
        tag = f"{variant}-{n}"
        empty = measured_run(variant, playbook(workdir / f"empty-{tag}.json", 0, tag), inventory, workdir, core_venv)
        full = measured_run(variant, playbook(workdir / f"full-{tag}.json", tasks, tag), inventory, workdir, core_venv)
        samples.append((full - empty) / (tasks * nodes))
    return {"variant": variant, "cpu_per_host_task": round(statistics.median(samples), 4),
            "samples": [round(s, 4) for s in samples]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", nargs="+", choices=VARIANTS, default=["gpuboot", "plain", *SETTINGS])
    parser.add_argument("--core-venv", type=Path, help="a venv with another ansible-core, for the variant core")
    parser.add_argument("--subnet", default="10.213.61.0/24")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.nodes < 4:
        parser.error("--nodes: at least 4 (3 control planes and a worker)")
    workdir = Path(tempfile.mkdtemp(prefix="gpuboot-task-cost-"))
    inventory = workdir / "inventory.yml"
    gpuboot("lab", "down", "--name", LAB, check=False)
    gpuboot("lab", "up", "--name", LAB, "--flavour", "plain", "--control-planes", "3",
            "--workers", str(args.nodes - 3), "--gpu-workers", "0", "--subnet", args.subnet,
            "--inventory", str(inventory))
    results = []
    try:
        for variant in args.variant:
            results.append(per_host_task(variant, args.nodes, args.tasks, args.repeat, inventory, workdir,
                                         args.core_venv))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    finally:
        gpuboot("lab", "down", "--name", LAB, check=False)
    summary = {"machine": f"{os.cpu_count()} cores", "nodes": args.nodes, "tasks": args.tasks, "results": results}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
