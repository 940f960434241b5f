"""The split run in the lab (docs/executors.md): two executor containers beside the session
lab, named in gpuboot.executors, run the node-local phases (os_prep, container_runtime,
kube_packages) over ansible-runner's transmit / worker / process, reached over real ssh with
host-key checking on, each for its own share of the nodes; preflight stays on the control
machine. The nodes' sshd says who connected, so the test knows the work ran on the executors,
not here. An executor that cannot be reached fails its own hosts, with ssh's words, and only
those.

It leaves the session lab's nodes prepared (containerd, the stand-in Kubernetes packages): its
name sorts it after the other modules on that lab (test_node_prep_phases first finds the nodes
without Kubernetes packages)."""
from __future__ import annotations

import subprocess
import time

import pytest

from gpuboot.cli.main import run
from tests.integration import lab_executors
from tests.integration.conftest import ssh
from tests.integration.test_node_prep_phases import (
    events_of,
    prepared_inventory,  # noqa: F401 (a fixture)
)

pytestmark = pytest.mark.lab

SPLIT = ("os_prep", "container_runtime", "kube_packages")


@pytest.fixture(scope="module")
def executors(lab, prepared_inventory, tmp_path_factory):  # noqa: F811 (the imported fixture)
    started = lab_executors.start(lab["lab"], 2, prepared_inventory, tmp_path_factory.mktemp("executors"))
    yield {"inventory": str(started.inventory), "containers": started.containers, "address": started.addresses}
    subprocess.run(["podman", "rm", "-f", *started.containers], capture_output=True)


def reached_from(lab, host: str, since: int, addresses: dict[str, str]) -> set[str]:
    """The executors whose address the host's sshd accepted a login from since `since`."""
    log = ssh(lab, host, f"journalctl -u ssh.service --no-pager -o cat --since @{since}")
    assert log.returncode == 0, log.stderr
    return {name for name, address in addresses.items() if f"Accepted publickey for root from {address} " in log.stdout}


def test_the_node_local_phases_run_on_the_executors_as_one_stream(lab, executors, capsys):
    since = int(time.time()) - 1
    assert run(["up", executors["inventory"], "--to", "kube_packages", "--force", "--output", "json"]) == 0
    events = events_of(capsys.readouterr().out)
    started = {e["phase"]: e for e in events if e["event"] == "PhaseStarted"}
    hosts = sorted(lab["state"].addresses)
    assert "on the executors" not in started["preflight"]["reason"]  # it compares all hosts: here
    half = len(hosts) // 2
    for phase in SPLIT:
        assert f"on the executors ex1 ({half} hosts), ex2 ({len(hosts) - half} hosts)" in started[phase]["reason"]
    # One stream: every host's task results come back in each split phase, and one merged summary.
    for phase in SPLIT:
        at = events.index(started[phase])
        end = next(i for i, e in enumerate(events) if i > at and e["event"] == "PhaseFinished")
        window = events[at:end]
        assert {e["host"] for e in window if e["event"] == "HostResult"} == set(hosts), phase
        stats = [e for e in window if e["event"] == "PlaybookStats"]
        assert len(stats) == 1 and sorted(stats[0]["hosts"]) == hosts, phase
        assert events[end]["status"] == "ok", events[end]
    # Each node was reached from its share's executor only: the first half of the phase's hosts
    # (in inventory order) from ex1, the rest from ex2.
    order = started["os_prep"]["hosts"]
    share = {host: "ex1" if index < half else "ex2" for index, host in enumerate(order)}
    reached = {host: reached_from(lab, host, since, executors["address"]) for host in hosts}
    assert reached == {host: {share[host]} for host in hosts}, reached
    # The split run's result holds: a plain run finds every phase converged on every host.
    assert run(["up", executors["inventory"], "--to", "kube_packages", "--output", "json"]) == 0
    again = events_of(capsys.readouterr().out)
    assert not [e for e in again if e["event"] == "PhaseStarted"], [e for e in again if e["event"] == "PhaseStarted"]


def test_an_executor_that_cannot_be_reached_fails_its_own_hosts_with_the_reason(lab, executors, capsys):
    subprocess.run(["podman", "stop", "-t", "2", executors["containers"][1]], check=True, capture_output=True)
    try:
        assert run(["up", executors["inventory"], "--only", "os_prep", "--force", "--output", "json"]) == 4
    finally:
        subprocess.run(["podman", "start", executors["containers"][1]], check=True, capture_output=True)
    events = events_of(capsys.readouterr().out)
    hosts = sorted(lab["state"].addresses)
    order = next(e for e in events if e["event"] == "PhaseStarted" and e["phase"] == "os_prep")["hosts"]
    ex2 = set(order[len(order) // 2:])  # the second share, in inventory order
    finished = next(e for e in reversed(events) if e["event"] == "RunFinished")
    assert finished["status"] == "failed" and finished["resume"].endswith("--from os_prep"), finished
    assert {f["host"] for f in finished["failures"]} == ex2, finished["failures"]
    for failure in finished["failures"]:
        assert failure["message"].startswith("executor ex2: ") and "ssh: " in failure["message"], failure
    # ex1's share ran and finished: its hosts have results and no failure.
    results = [e for e in events if e["event"] == "HostResult" and e["host"] not in ex2]
    assert {e["host"] for e in results} == set(hosts) - ex2
    assert not [e for e in results if e["status"] in ("failed", "unreachable")]
