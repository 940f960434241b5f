"""gpuboot.executors: a node-local phase's hosts split among execution nodes through
ansible-runner's streaming interface (transmit, worker, process). Here the transport is a real
`ansible-runner worker` started on this machine, so the stream, the staging and the event
translation are the real ones; ssh to an executor is covered by its argv and by the lab."""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from gpuboot.ansible.executors import SplitRunner, Transport, shares, ssh_transport, stage
from gpuboot.ansible.runner import PlaybookRun
from gpuboot.config.model import Executor, GpubootSettings, Ssh
from gpuboot.events import HostResult, PlaybookStats

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = """- name: A node-local play
  hosts: nodes
  gather_facts: false
  tasks:
    - name: Read the CA the settings name, on the executor
      ansible.builtin.debug:
        msg: "{{ inventory_hostname }} {{ lookup('ansible.builtin.file', gpuboot_settings.mirror.ca_file) }}"
    - name: Fail where the inventory says so
      ansible.builtin.fail:
        msg: planted failure
      when: fail_here | default(false) | bool
"""


@pytest.fixture
def content(tmp_path, monkeypatch):
    """A content directory (what a checkout or the wheel holds) with one small playbook."""
    root = tmp_path / "content"
    (root / "playbooks").mkdir(parents=True)
    (root / "roles").mkdir()
    (root / "mirror" / "releases").mkdir(parents=True)
    (root / "ansible.cfg").write_text((ROOT / "ansible.cfg").read_text())
    (root / "playbooks" / "node_local.yml").write_text(PLAYBOOK)
    monkeypatch.setenv("GPUBOOT_CONTENT_DIR", str(root))
    return root


def inventory(tmp_path: Path, hosts: list[str], failing: str | None = None) -> Path:
    """An inventory file with its group_vars/ beside it, as operators write them."""
    folder = tmp_path / "site"
    (folder / "group_vars").mkdir(parents=True, exist_ok=True)
    (folder / "group_vars" / "nodes.yml").write_text("ansible_connection: local\n"
                                                    f"ansible_python_interpreter: {sys.executable}\n")
    lines = ["[nodes]", *(f"{h}{' fail_here=true' if h == failing else ''}" for h in hosts)]
    (folder / "hosts.ini").write_text("\n".join(lines) + "\n")
    return folder / "hosts.ini"


def request(tmp_path: Path, inv: Path, hosts: list[str]) -> PlaybookRun:
    ca = tmp_path / "site" / "ca.crt"
    ca.write_text("PLANTED-CA")
    settings = {"mirror": {"ca_file": "ca.crt"}}  # relative: to the inventory's folder
    return PlaybookRun(playbook=Path("node_local.yml"), inventory=inv, artifact_dir=tmp_path / "artifacts",
                       ident="node_local", extravars={"gpuboot_settings": settings, "gpuboot_run_id": "r1"},
                       envvars={"ANSIBLE_NOCOLOR": "1", "PATH": "/control/only"}, forks=4, limit=tuple(hosts))


def local_worker(tmp_path: Path) -> object:
    """A transport that starts the worker here, each share in a directory of its own."""
    def transport(executor: Executor, ssh: Ssh, run_id: str, ident: str, inventory_dir: Path) -> Transport:
        worker_dir = str(tmp_path / "executors" / executor.name / f"{run_id}-{ident}")
        return Transport(executor.name, (str(BIN / "ansible-runner"), "worker", "--private-data-dir", worker_dir,
                                         "--delete"), worker_dir, str(BIN))
    return transport


def broken_worker(tmp_path: Path, broken: str) -> object:
    working = local_worker(tmp_path)

    def transport(executor: Executor, ssh: Ssh, run_id: str, ident: str, inventory_dir: Path) -> Transport:
        if executor.name != broken:
            return working(executor, ssh, run_id, ident, inventory_dir)
        return Transport(executor.name, ("sh", "-c", "cat >/dev/null; echo 'ssh: connect to host ex2 port 22: "
                                         "Connection refused' >&2; exit 255"), "/nowhere")
    return transport


EXECUTORS = [Executor(name="ex1", address="192.0.2.1"), Executor(name="ex2", address="192.0.2.2")]


def collect() -> tuple[list, object]:
    events: list = []
    lock = threading.Lock()

    def on_event(event):
        with lock:
            events.append(event)
    return events, on_event


def test_hosts_split_among_executors_come_back_as_one_stream(tmp_path, content):
    hosts = [f"node{i:02d}" for i in range(1, 6)]
    inv = inventory(tmp_path, hosts)
    events, on_event = collect()
    runner = SplitRunner(EXECUTORS, Ssh(), transport=local_worker(tmp_path))
    result = runner(request(tmp_path, inv, hosts), on_event, threading.Event())
    assert result.ok, [e for e in events if isinstance(e, HostResult)]
    results = [e for e in events if isinstance(e, HostResult) and e.task == "Read the CA the settings name, on the executor"]
    assert sorted(e.host for e in results) == hosts
    # The CA file was shipped to the worker and the settings pointed at the copy.
    assert all(e.status == "ok" for e in results)
    stats = [e for e in events if isinstance(e, PlaybookStats)]
    assert len(stats) == 1 and sorted(stats[0].hosts) == hosts  # one merged summary
    assert all(c.failed == 0 and c.ok == 1 and c.skipped == 1 for c in stats[0].hosts.values())
    # Each executor unpacked its share and deleted it; the staging on this machine is gone too.
    assert [p for p in (tmp_path / "executors").rglob("*") if p.is_file()] == []
    assert not list((tmp_path / "artifacts").glob("*.stage"))
    # The shares' artifacts came back, each under its own ident.
    assert sorted(p.name for p in (tmp_path / "artifacts").iterdir() if p.is_dir()) == ["node_local-ex1", "node_local-ex2"]


def test_a_failing_host_fails_the_phase_with_its_reason(tmp_path, content):
    hosts = ["node01", "node02", "node03", "node04"]
    events, on_event = collect()
    runner = SplitRunner(EXECUTORS, Ssh(), transport=local_worker(tmp_path))
    result = runner(request(tmp_path, inventory(tmp_path, hosts, failing="node04"), hosts), on_event, None)
    assert not result.ok
    failed = [e for e in events if isinstance(e, HostResult) and e.status == "failed"]
    assert [(e.host, e.message) for e in failed] == [("node04", "planted failure")]


def test_an_executor_that_cannot_be_reached_fails_its_hosts_with_ssh_words(tmp_path, content):
    hosts = ["node01", "node02", "node03", "node04"]
    events, on_event = collect()
    runner = SplitRunner(EXECUTORS, Ssh(), transport=broken_worker(tmp_path, "ex2"))
    result = runner(request(tmp_path, inventory(tmp_path, hosts), hosts), on_event, None)
    assert not result.ok
    failed = {e.host: e.message for e in events if isinstance(e, HostResult) and e.status == "failed"}
    assert sorted(failed) == ["node03", "node04"]  # ex2's share; ex1's ran
    assert all(m.startswith("executor ex2: ") and "Connection refused" in m for m in failed.values())
    stats = next(e for e in events if isinstance(e, PlaybookStats))
    assert stats.hosts["node03"].failed == 1 and stats.hosts["node01"].ok == 1


def test_staging_points_the_worker_at_its_own_paths(tmp_path, content):
    inv = inventory(tmp_path, ["node01"])
    req = request(tmp_path, inv, ["node01"])
    key = tmp_path / "id_ed25519"
    key.write_text("PLANTED-KEY")
    req = PlaybookRun(**{**req.__dict__, "envvars": {**req.envvars, "ANSIBLE_PRIVATE_KEY_FILE": str(key)}})
    into = tmp_path / "staged"
    kwargs = stage(req, Transport("ex1", ("true",), "/var/tmp/w/r1", "/opt/runner/bin"), into)
    env = kwargs["envvars"]
    assert env["ANSIBLE_CONFIG"] == "/var/tmp/w/r1/project/ansible.cfg"
    assert env["ANSIBLE_PRIVATE_KEY_FILE"] == "/var/tmp/w/r1/files/ssh-key"
    assert env["PATH"].startswith("/opt/runner/bin:") and "/control/only" not in env["PATH"]
    assert (into / "files" / "ssh-key").read_text() == "PLANTED-KEY"
    assert oct((into / "files" / "ssh-key").stat().st_mode & 0o777) == "0o600"
    assert oct((into / "env" / "extravars").stat().st_mode & 0o777) == "0o600"
    assert (into / "inventory" / "group_vars" / "nodes.yml").is_file()
    assert kwargs["inventory"] == str(into / "inventory" / "hosts.ini") and kwargs["limit"] == "node01"
    assert '"/var/tmp/w/r1/files/0-ca.crt"' in (into / "env" / "extravars").read_text()


def test_shares_are_contiguous_and_even():
    hosts = [f"n{i}" for i in range(7)]
    split = shares(hosts, EXECUTORS + [Executor(name="ex3", address="192.0.2.3")])
    assert [(e.name, s) for e, s in split] == [("ex1", ["n0", "n1"]), ("ex2", ["n2", "n3"]), ("ex3", ["n4", "n5", "n6"])]
    assert [(e.name, s) for e, s in shares(["n0"], EXECUTORS)] == [("ex2", ["n0"])]


def test_ssh_transport_keeps_host_key_checking_and_takes_the_executor_login():
    ssh = Ssh(user="ops", port=2222, private_key_file="/keys/nodes")
    own = Executor(name="ex1", address="10.0.0.9", user="runner", port=22, runner="/opt/ar/bin/ansible-runner")
    transport = ssh_transport(own, ssh, "r1", "os_prep-ex1", Path("/site"))
    argv = list(transport.argv)
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    assert "ConnectTimeout=20" in argv and "ServerAliveInterval=15" in argv and "ServerAliveCountMax=4" in argv
    assert argv[argv.index("-p") + 1] == "22" and argv[argv.index("-i") + 1] == "/keys/nodes"
    assert "runner@10.0.0.9" in argv
    assert argv[-1] == ("/opt/ar/bin/ansible-runner worker --private-data-dir "
                        "/var/tmp/gpuboot-executor/r1-os_prep-ex1 --delete")
    assert transport.bin_dir == "/opt/ar/bin"
    plain = ssh_transport(Executor(name="ex2", address="10.0.0.10", private_key_file="keys/ex",
                                   known_hosts_file="keys/known_hosts"), ssh, "r1", "x", Path("/site"))
    assert "ops@10.0.0.10" in plain.argv and plain.argv[plain.argv.index("-p") + 1] == "2222"
    assert plain.bin_dir is None and plain.argv[plain.argv.index("-i") + 1] == "/site/keys/ex"
    assert "UserKnownHostsFile=/site/keys/known_hosts" in plain.argv
    assert "UserKnownHostsFile" not in " ".join(transport.argv)  # unset: the operator's own known_hosts
    # The worker's masters to the nodes: one directory per run, short for the socket path.
    assert transport.control_path_dir == "/var/tmp/gpuboot-executor/cp/r1"


def test_executor_names_are_unique():
    base = {"cluster_name": "c", "release": "k8s-1.36", "control_plane": {"vip": "10.0.0.100"}}
    with pytest.raises(ValueError, match="ex1 named more than once"):
        GpubootSettings(**base, executors=[{"name": "ex1", "address": "10.0.0.1"},
                                           {"name": "ex1", "address": "10.0.0.2"}])
    with pytest.raises(ValueError):
        GpubootSettings(**base, executors=[{"name": "ex1", "address": "10.0.0.1", "work_dir": "relative/dir"}])
    with pytest.raises(ValueError):  # too long for the ssh control sockets below it
        GpubootSettings(**base, executors=[{"name": "ex1", "address": "10.0.0.1", "work_dir": "/" + "d" * 45}])


def test_only_phases_whose_hosts_need_no_other_host_are_split():
    from gpuboot.phases.catalog import UP
    assert [p.name for p in UP if p.node_local] == ["os_prep", "container_runtime", "kube_packages"]
    for phase in (p for p in UP if p.node_local):
        text = phase.path.read_text() + "".join(
            f.read_text() for role in phase.roles for f in (ROOT / "roles" / role / "tasks").glob("*.yml"))
        # No play by position, no other host's variables or the play's host list, nothing run
        # once for all or on another host: a share sees only its own hosts.
        assert not any("[" in pattern for pattern in phase.host_patterns), phase.name
        assert not [w for w in ("hostvars", "ansible_play_hosts", "run_once", "delegate_to") if w in text], phase.name
    # preflight compares machine-ids and host names across every host: it stays whole.
    preflight = next(p for p in UP if p.name == "preflight")
    assert "ansible_play_hosts" in (ROOT / "roles" / "preflight" / "tasks" / "main.yml").read_text()
    assert not preflight.node_local
    assert os.environ.get("GPUBOOT_CONTENT_DIR") is None
