"""The cost-per-node benchmark's own arithmetic: host-tasks from the run's stats, the lever's
environment, and the profile's sorting of sampled stacks into what the CPU did."""
from __future__ import annotations

import sys
import types

import pytest

from tests.bench import cpu_profile, up_scale

GPUBOOT = 'process 10:"python gpuboot up inv.yml"'
PLAYBOOK = 'process 11:"python ansible-playbook -i inv.yml playbooks/os_prep.yml"'
WORKER_BASE = [GPUBOOT, PLAYBOOK, "<module> (ansible-playbook:1)", "StrategyModule.run (linear.py:1)",
               "StrategyBase._queue_task (strategy/__init__.py:1)", "WorkerProcess.start (worker.py:1)",
               "Popen._launch (popen_fork.py:1)", "WorkerProcess.run (worker.py:2)", "TaskExecutor.run (t.py:1)"]


@pytest.mark.parametrize(("frames", "expected"), [
    ([GPUBOOT, "run (cli/main.py:1)", "handle (runner.py:1)"], "gpuboot's own process"),
    ([*WORKER_BASE, "ActionBase._execute_module (a.py:1)", "ActionBase._configure_module (a.py:2)",
      "modify_module (module_common.py:1)", "recursive_finder (module_common.py:2)"],
     "worker: building the module payload (module_utils scan, AnsiballZ)"),
    ([*WORKER_BASE, "ActionBase._low_level_execute_command (a.py:3)", "Connection.exec_command (ssh.py:1)",
      "Connection._bare_run (ssh.py:2)"], "worker: ssh round trips (exec, put, fetch)"),
    ([*WORKER_BASE, "Task.post_validate (task.py:1)", "Environment.compile (jinja2/environment.py:1)"],
     "worker: templating the task for the host (args, when, loops)"),
    ([*WORKER_BASE, "ActionModule.run (copy.py:1)", "ActionModule._copy_file (copy.py:2)"],
     "worker: action plugins' own work (copy's stat and diff, results)"),
    (WORKER_BASE, "worker: the rest (start-up after fork, task executor)"),
    ([GPUBOOT, PLAYBOOK, "StrategyModule.run (linear.py:1)", "StrategyBase._queue_task (strategy/__init__.py:1)",
      "BaseProcess.is_alive (process.py:1)"], "main: waiting for a free worker (more hosts than forks)"),
    # The parent's side of the fork: the same frames as a worker's, without WorkerProcess.run.
    (WORKER_BASE[:7], "main: forking a worker per host per task"),
    ([GPUBOOT, PLAYBOOK, "StrategyModule.run (linear.py:1)", "VariableManager.get_vars (manager.py:1)"],
     "main: variables of each host for each task"),
    ([GPUBOOT, PLAYBOOK, "StrategyModule.run (linear.py:1)", "TaskQueueManager.send_callback (tqm.py:1)"],
     "main: callbacks (ansible-runner's event records)"),
    ([GPUBOOT, PLAYBOOK, "StrategyModule.run (linear.py:1)"], "main: the rest (strategy loop, task queue)"),
])
def test_a_sampled_stack_is_put_where_its_work_belongs(frames, expected):
    assert cpu_profile.category(frames) == expected


def test_the_summary_sums_samples_per_category_into_seconds_and_shares(tmp_path):
    raw = tmp_path / "profile.txt"
    raw.write_text("\n".join([
        ";".join([GPUBOOT, "run (cli/main.py:1)"]) + " 97",
        ";".join([*WORKER_BASE, "Connection.exec_command (ssh.py:1)"]) + " 291",
        "not a sample line",
    ]) + "\n")
    rows = cpu_profile.summarise(raw)
    assert rows == [("worker: ssh round trips (exec, put, fetch)", 3.0, 0.75), ("gpuboot's own process", 1.0, 0.25)]


def test_host_tasks_count_every_result_of_every_host_in_every_playbook():
    events = [
        {"event": "PhaseStarted", "phase": "os_prep"},
        {"event": "PlaybookStats", "hosts": {
            "cp1": {"ok": 10, "changed": 4, "failed": 0, "unreachable": 0, "skipped": 3, "ignored": 0},
            "w1": {"ok": 8, "changed": 8, "failed": 1, "unreachable": 0, "skipped": 3, "ignored": 0}}},
        {"event": "PlaybookStats", "hosts": {
            "w2": {"ok": 0, "changed": 0, "failed": 0, "unreachable": 1, "skipped": 0, "ignored": 0}}},
    ]
    # changed results are ok results too: counting both would count them twice
    assert up_scale.host_tasks(events) == 13 + 12 + 1


def test_a_lever_reaches_gpuboot_only_as_ansible_settings(monkeypatch):
    monkeypatch.setenv("SOME_TOKEN", "kept")
    env = up_scale.lever_environment(None, ["ANSIBLE_STRATEGY=free", "ANSIBLE_FORKS=50"])
    assert env["ANSIBLE_STRATEGY"] == "free" and env["ANSIBLE_FORKS"] == "50" and env["SOME_TOKEN"] == "kept"
    with pytest.raises(SystemExit, match="ANSIBLE_<SETTING>=<value>"):
        up_scale.lever_environment(None, ["STRATEGY=free"])
    with pytest.raises(SystemExit, match="ANSIBLE_<SETTING>=<value>"):
        up_scale.lever_environment(None, ["ANSIBLE_STRATEGY"])


def test_the_mitogen_lever_names_its_strategy_and_where_ansible_finds_it(monkeypatch, tmp_path):
    package = types.ModuleType("ansible_mitogen")
    package.__file__ = str(tmp_path / "ansible_mitogen" / "__init__.py")
    monkeypatch.setitem(sys.modules, "ansible_mitogen", package)
    env = up_scale.lever_environment("mitogen", [])
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert env["ANSIBLE_STRATEGY_PLUGINS"] == str(tmp_path / "ansible_mitogen" / "plugins" / "strategy")


def test_the_mitogen_lever_without_mitogen_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ansible_mitogen", None)  # import fails as if not installed
    with pytest.raises(SystemExit, match="pip install mitogen"):
        up_scale.lever_environment("mitogen", [])


def test_the_rows_for_the_docs_carry_date_commit_machine_command_and_every_size():
    def size(nodes, wall, cpu):
        return {"nodes": nodes, "first": {"wall": wall, "changed": 21 * nodes, "control_cpu": cpu,
                                          "gpuboot_peak_mib": 63, "child_peak_mib": 70},
                "rerun": {"wall": 5.0, "changed": 0}, "rerun_share": 5.0 / wall,
                "host_tasks_per_node": 83.0, "cpu_seconds_per_node": round(cpu / nodes, 2),
                "node_cpu_seconds_per_node": 31.0}
    summary = {"machine": "2 cores, 23 GiB", "commit": "abc1234", "sizes": [size(5, 100.0, 50.0), size(10, 200.0, 90.0)],
               "marginal_control_cpu_per_node": 8.0, "marginal_host_tasks_per_node": 83.0,
               "marginal_seconds_per_node": 20.0}
    text = up_scale.markdown(summary, "python -m tests.bench.up_scale --nodes 5 10")
    head, _, table = text.partition("\n\n")
    assert "commit abc1234" in head and "2 cores, 23 GiB" in head and "--nodes 5 10" in head
    rows = [line for line in table.splitlines() if line.startswith("| 5 ") or line.startswith("| 10 ")]
    assert len(rows) == 2 and "| 50.0 s | 10.0 s |" in rows[0] and "| 90.0 s | 9.0 s |" in rows[1]
    assert "Per extra node: 8.0 control CPU-seconds, 83.0 host-tasks" in text


def test_the_split_run_row_puts_the_executors_cpu_beside_the_nodes():
    size = {"nodes": 10, "executors": 2, "first": {"wall": 150.0, "changed": 200, "control_cpu": 12.0,
                                                   "gpuboot_peak_mib": 63, "child_peak_mib": 70},
            "rerun": {"wall": 6.0, "changed": 0}, "rerun_share": 0.04, "host_tasks_per_node": 70.0,
            "cpu_seconds_per_node": 1.2, "node_cpu_seconds_per_node": 30.0, "executor_cpu_seconds_per_node": 6.5}
    text = up_scale.markdown({"machine": "2 cores", "commit": "abc1234", "sizes": [size]}, "up_scale --executors 2")
    row = next(line for line in text.splitlines() if line.startswith("| 10 "))
    assert "| 12.0 s | 1.2 s | 30.0 s (+ 6.5 s on 2 executors) |" in row
    assert "by step" not in text  # a run measured without a cgroup has no profile
    size["first"]["control_cpu_by_step"] = {"start": 1.0, "lock and probe": 2.5, "preflight": 6.0}
    text = up_scale.markdown({"machine": "2 cores", "commit": "abc1234", "sizes": [size]}, "up_scale --executors 2")
    assert "- 10 nodes: start 1.0 s, lock and probe 2.5 s, preflight 6.0 s" in text


def test_a_container_without_a_cgroup_reading_gives_no_figure(monkeypatch):
    monkeypatch.setattr(up_scale.subprocess, "run", lambda *a, **k: up_scale.subprocess.CompletedProcess(a, 125, "", ""))
    assert up_scale.container_cpu_seconds("gpuboot-bench-ex1") is None
    assert up_scale.executors_cpu_seconds(["gpuboot-bench-ex1"]) is None
    assert up_scale.executors_cpu_seconds([]) is None


def test_the_control_cpu_is_split_by_the_step_of_the_run_that_spent_it():
    marks = [["RunStarted", None, 1.0], ["PhaseSkipped", "preflight", 3.5], ["PhaseStarted", "os_prep", 3.6],
             ["PhaseFinished", "os_prep", 13.6], ["PhaseStarted", "kube_packages", 14.0],
             ["PhaseFinished", "kube_packages", 20.0], ["RunFinished", None, 22.0]]
    assert up_scale.cpu_by_step(marks, 22.5) == {
        "start": 1.0, "lock and probe": 2.5, "between phases": 0.5, "os_prep": 10.0, "kube_packages": 6.0,
        "record and unlock": 2.0, "exit": 0.5}
    assert up_scale.cpu_by_step([], 22.5) == {} and up_scale.cpu_by_step(marks, None) == {}


def test_a_measured_run_reads_the_cpu_at_each_phase_event_as_it_streams(monkeypatch):
    class Cgroup:
        readings = iter([1.0, 4.0, 9.0, 9.5])

        def enter(self):
            pass

        def cpu_seconds(self):
            return next(self.readings)

        def close(self):
            pass

    monkeypatch.setattr(up_scale, "control_cgroup", Cgroup)
    events = ['{"event": "RunStarted"}', '{"event": "TaskStarted", "task": "x"}',
              '{"event": "PhaseStarted", "phase": "os_prep"}', '{"event": "PhaseFinished", "phase": "os_prep"}']
    script = "import sys; print(sys.argv[1]); print('done', file=sys.stderr)"
    proc, total, marks = up_scale.run_measured([sys.executable, "-c", script, "\n".join(events)])
    assert proc.returncode == 0 and proc.stderr == "done\n" and proc.stdout.count("\n") == 4
    assert marks == [["RunStarted", None, 1.0], ["PhaseStarted", "os_prep", 4.0], ["PhaseFinished", "os_prep", 9.0]]
    assert total == 9.5
