"""Faults done to a lab node at a chosen moment while gpuboot runs: a thread asks the node over
SSH (every 0.3 s) whether a shell test passes, and the moment it does, acts on the node from
outside: cuts its power (SIGKILL to its container's systemd) or cuts it off the network."""
from __future__ import annotations

import shlex
import subprocess
import threading
import time


class NodeFault:
    """Base: `act` is the fault; `cut_after` says when it happened (None: never)."""

    def __init__(self, info, node: str, container: str, when: str, timeout: float = 900):
        self.info, self.node, self.container, self.when, self.timeout = info, node, container, when, timeout
        self.cut_after: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def act(self) -> None:
        raise NotImplementedError

    def ssh(self, command: str) -> subprocess.CompletedProcess[str]:
        from tests.integration.conftest import ssh
        return ssh(self.info, self.node, command)

    def __enter__(self):
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join(timeout=90)

    def _watch(self) -> None:
        deadline = self._started + self.timeout
        while not self._done.is_set() and time.monotonic() < deadline:
            try:
                answer = self.ssh(f"if {self.when} >/dev/null; then echo CUT; fi").stdout
            except subprocess.TimeoutExpired:
                continue
            if "CUT" in answer:
                self.act()
                self.cut_after = time.monotonic() - self._started
                return
            time.sleep(0.3)

    def _wait_for_ssh(self, test: str, what: str) -> None:
        deadline = time.monotonic() + 120
        while self.ssh(test).returncode != 0:
            assert time.monotonic() < deadline, f"{self.node} {what}"
            time.sleep(2)


class PowerCut(NodeFault):
    """Kills the node's container (its systemd gets SIGKILL: a power cut); `power_on` starts it
    again and waits for its SSH."""

    def act(self) -> None:
        subprocess.run(["podman", "kill", self.container], check=True, capture_output=True)

    def power_on(self) -> None:
        subprocess.run(["podman", "start", self.container], check=True, capture_output=True)
        self._wait_for_ssh("systemctl is-system-running --wait >/dev/null; true", "did not come back")


class Firewall(NodeFault):
    """An nftables table in the node's own network namespace drops every packet in and out but
    loopback's, as a failed switch port or a wrong firewall change does; SSH to it stops too.
    `lift` removes the table and waits for its SSH."""

    TABLE = "gpuboot_fault_cut_off"

    def _nft(self, rules: str) -> None:
        pid = subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}}", self.container],
                             check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(["nsenter", "-t", pid, "-n", "nft", "-f", "-"], input=rules, check=True,
                       capture_output=True, text=True)

    def act(self) -> None:
        self._nft(f"table inet {self.TABLE} {{\n"
                  "  chain in { type filter hook input priority -300; policy drop; iif lo accept; }\n"
                  "  chain out { type filter hook output priority -300; policy drop; oif lo accept; }\n}\n")

    def lift(self) -> None:
        self._nft(f"delete table inet {self.TABLE}\n")
        self._wait_for_ssh("true", "is not reachable after the firewall was lifted")


def freeze_when_seen(info, node: str, pattern: str, mark: str, timeout: int = 1800) -> str:
    """Start, on the node itself, a watcher that sees a process matching `pattern` within 50 ms
    and freezes it (SIGSTOP), then touches `mark` (under /run: gone with the power). A step that
    lasts under a second (kubeadm upgrading a kubelet's configuration) is missed by a watch
    asked over SSH, which has a gap at each round trip; frozen, the step is still running when
    the fault, asked for over SSH, lands. Returns the shell test for the fault's `when`."""
    from tests.integration.conftest import ssh
    watcher = (f"until pgrep -f {shlex.quote(pattern)} >/dev/null; do sleep 0.05; done; "
               f"pkill -STOP -f {shlex.quote(pattern)}; touch {mark}")
    started = ssh(info, node, f"rm -f {mark}; setsid timeout {timeout} sh -c {shlex.quote(watcher)} "
                              "</dev/null >/dev/null 2>&1 & echo started")
    assert "started" in started.stdout, started.stderr
    return f"test -e {mark}"
