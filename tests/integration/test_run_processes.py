"""A run's processes are stopped with it, all of them: ansible-playbook, and its workers,
which Ansible starts in sessions of their own (out of reach of ansible-runner's kill of
ansible-playbook's process group), and the commands they run. Real ansible-playbook over
the local connection; after a cancel nothing is left, and after gpuboot itself is killed
(SIGKILL, which nothing catches) the next run stops what was left before it starts."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpuboot import processes
from gpuboot.ansible.runner import PlaybookRun, run_playbook
from gpuboot.config.loader import load_cluster
from gpuboot.events import ProcessesStopped
from gpuboot.net import free_port
from gpuboot.phases.catalog import UP
from gpuboot.phases.engine import Engine, RunOptions
from gpuboot.state import ClusterState
from tests.doubles.runner_double import RunnerDouble, ScriptedPhase

ROOT = Path(__file__).resolve().parents[2]
PLAY = """\
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.command: sleep 300
"""


def _site(tmp_path: Path) -> tuple[Path, Path]:
    play, inventory = tmp_path / "play.yml", tmp_path / "inventory.ini"
    play.write_text(PLAY)
    inventory.write_text("".join(f"h{i} ansible_connection=local ansible_python_interpreter={sys.executable}\n"
                                 for i in range(3)))
    return play, inventory


def _cmdline(pid: int) -> bytes:
    # A marked process can end between the listing and this read (an Ansible worker's
    # short-lived helpers do): it is then no sleep of ours.
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def _sleeps(mark_root: Path) -> list[int]:
    return [p for p in processes.marked(mark_root) if _cmdline(p).startswith(b"sleep\x00300\x00")]


def _wait_for(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_a_cancelled_playbook_leaves_no_worker_and_no_command_behind(tmp_path):
    play, inventory = _site(tmp_path)
    artifacts = tmp_path / "runs" / "r1" / "phases"
    cancel = threading.Event()
    seen: list[bool] = []

    def cancel_once_every_host_sleeps() -> None:
        try:  # cancel whatever happens, so a failed wait cannot leave the playbook 300 s to run
            _wait_for(lambda: len(_sleeps(tmp_path)) == 3)
            seen.append(True)
        finally:
            cancel.set()

    watcher = threading.Thread(target=cancel_once_every_host_sleeps)
    watcher.start()
    result = run_playbook(PlaybookRun(play, inventory, artifacts, "p"), lambda e: None, cancel=cancel)
    watcher.join()
    assert seen, "the three hosts' sleep commands were not all seen running before the cancel"
    assert result.status == "canceled"
    # Ansible's workers run in sessions of their own: ansible-runner's kill does not reach them.
    assert processes.marked(tmp_path) == []


DRIVER = """\
import sys
from pathlib import Path
from gpuboot.ansible.runner import PlaybookRun, run_playbook
run_playbook(PlaybookRun(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), "p"), lambda e: None)
"""


def test_after_gpuboot_is_killed_the_next_run_stops_what_it_left(tmp_path):
    play, inventory = _site(tmp_path)
    cluster = load_cluster(ROOT / "inventories" / "sample" / "inventory.yml")
    state = ClusterState.for_cluster(tmp_path / "state", cluster.settings.cluster_name)
    killed_run = state.root / "runs" / "20261124T000000-dead" / "phases"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(play), str(inventory), str(killed_run)],
                              env={**os.environ, "PYTHONPATH": str(ROOT / "bootstrap")})
    try:
        _wait_for(lambda: len(_sleeps(state.root)) == 3)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        time.sleep(1)
        orphans = processes.marked(state.root)
        assert len(orphans) >= 1 + 3 + 3, orphans  # ansible-playbook, its workers and their commands

        events = []
        runner = RunnerDouble({"preflight": ScriptedPhase({"cp01": "ok"})})
        phases = [p for p in UP if p.name == "preflight"]
        finished = Engine(cluster, state, RunOptions(), events.append, runner=runner).run(phases)
        assert finished.status == "ok"
        stopped = [e for e in events if isinstance(e, ProcessesStopped)]
        assert len(stopped) == 1 and stopped[0].runs == ["20261124T000000-dead"]
        assert set(orphans) <= set(stopped[0].pids)
        assert processes.marked(state.root) == []
        log = Path(finished.log).read_text()
        assert "ProcessesStopped" in log and "20261124T000000-dead" in log
    finally:
        processes.stop(processes.marked(state.root), grace=1)
        if driver.poll() is None:
            driver.kill()


def test_ssh_control_masters_of_a_run_are_left_to_serve_the_next_phase(tmp_path):
    mark = tmp_path / "runs" / "r1" / "phases"
    env = {**os.environ, processes.RUN_MARK: str(mark)}
    master = subprocess.Popen(["bash", "-c", "exec -a 'ssh: /root/.ansible/cp/abc [mux]' sleep 60"], env=env)
    worker = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        _wait_for(lambda: worker.pid in processes.marked(tmp_path), timeout=10)
        assert master.pid not in processes.marked(tmp_path)
        assert processes.stop(processes.marked(tmp_path), grace=2) == [worker.pid]
        assert worker.wait(timeout=5) == -signal.SIGTERM and master.poll() is None
    finally:
        master.kill()
        worker.kill()


def _serving(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    """`gpuboot mirror serve` with a package server (so it stays in Python, the registry its
    child), and the registry's pid once it answers."""
    packages = tmp_path / "packages"
    packages.mkdir()
    # Ports the kernel has free now: a fixed one may be any busy machine's outgoing connection.
    registry_port, packages_port = free_port(), free_port()
    while packages_port == registry_port:
        packages_port = free_port()
    gpuboot = subprocess.Popen([str(Path(sys.executable).parent / "gpuboot"), "mirror", "serve", "--root",
                                str(tmp_path / "root"), "--listen", f"127.0.0.1:{registry_port}", "--plain-http",
                                "--packages-dir", str(packages), "--packages-listen", f"127.0.0.1:{packages_port}"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               cwd=tmp_path)
    # Ready once it says where it serves (the registry answers by then).
    said = []
    for line in gpuboot.stdout:
        said.append(line)
        if line.startswith("serving "):
            break
    assert gpuboot.poll() is None, "".join(said)
    children = subprocess.run(["pgrep", "-P", str(gpuboot.pid)], capture_output=True, text=True).stdout.split()
    assert children, f"no registry under gpuboot: {''.join(said)}"
    return gpuboot, int(children[0])


def _gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie of an exited child counts as gone: its parent was killed with it.
        if "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            return True
        time.sleep(0.2)
    return False


def test_a_killed_mirror_serve_leaves_no_registry_behind(tmp_path):
    # docker-registry is one of bootstrap/host-packages.txt.
    gpuboot, registry = _serving(tmp_path)
    gpuboot.kill()  # SIGKILL: nothing in gpuboot runs
    gpuboot.wait(10)
    assert _gone(registry), "the registry outlived a SIGKILLed gpuboot mirror serve"


def test_a_closed_terminal_stops_mirror_serve_and_its_registry(tmp_path):
    gpuboot, registry = _serving(tmp_path)
    gpuboot.send_signal(signal.SIGHUP)
    assert gpuboot.wait(15) == 0
    assert _gone(registry)


def test_a_taken_package_address_is_named_and_the_registry_stops(tmp_path):
    (tmp_path / "packages").mkdir()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        proc = subprocess.run([str(Path(sys.executable).parent / "gpuboot"), "mirror", "serve", "--root",
                               str(tmp_path / "root"), "--listen", f"127.0.0.1:{free_port()}", "--plain-http",
                               "--packages-dir", str(tmp_path / "packages"), "--packages-listen", f"127.0.0.1:{taken}"],
                              capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 6, proc.stdout + proc.stderr
    said = proc.stdout + proc.stderr
    assert f"the package server could not listen on 127.0.0.1:{taken}" in said and "--packages-listen" in said
    registry_log = tmp_path / "root" / "registry.log"
    assert "listening on" in registry_log.read_text()  # it had started, and was stopped with the failure
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "root")], capture_output=True, text=True).stdout
    assert not left.strip(), f"a registry outlived the failed start: {left}"


def test_a_token_in_the_operators_shell_never_reaches_the_playbook_or_its_record(tmp_path, monkeypatch):
    """ansible-runner records the environment when the run starts: while the playbook runs
    (where a SIGKILL would leave it) the record and ansible-playbook's own environment hold
    only what a playbook needs, never a token kept in the shell."""
    planted = "ghp_plantedTOKENvalue0123456789"
    monkeypatch.setenv("GITHUB_TOKEN", planted)
    monkeypatch.setenv("HTTPS_PROXY", f"http://user:{planted}@proxy.invalid:3128")
    play, inventory = tmp_path / "play.yml", tmp_path / "inventory.ini"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n"
                    "    - ansible.builtin.command: sh -c 'env > {{ out }}'\n")
    inventory.write_text(f"h0 ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    artifacts = tmp_path / "artifacts"
    seen: list[str] = []

    def during(event) -> None:
        record = artifacts / "p" / "command"
        if record.exists():
            seen.append(record.read_text())

    result = run_playbook(PlaybookRun(play, inventory, artifacts, "p", extravars={"out": str(tmp_path / "env")}), during)
    assert result.status == "successful"
    assert seen, "the run's command record was not there while it ran"
    assert not [text for text in seen if planted in text]
    assert "ANSIBLE_" in seen[0] or "PATH" in seen[0]
    assert planted not in (tmp_path / "env").read_text()  # the playbook's own process
    leaked = [str(p) for p in artifacts.rglob("*") if p.is_file() and planted in p.read_text(errors="replace")]
    assert not leaked
