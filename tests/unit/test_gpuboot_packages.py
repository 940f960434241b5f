"""gpuboot_packages (playbooks/library, logic in playbooks/module_utils): pinned packages in
bounded tries. The bound is checked on real processes (a try's whole session stops, also what
it started in the background and what ignores SIGTERM); the package-manager logic against a
recording runner that answers as dpkg-query, apt-cache, apt-get, rpm and dnf do."""
from __future__ import annotations

import os
import sys
import time

import pytest

from tests.support.modules import load_module

load_module("gpuboot_packages")
from ansible.module_utils.gpuboot_packages import Apt, Dnf, Try, Wanted, converge, run_bounded  # noqa: E402


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, within: float = 5) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_try_that_finishes_gives_its_exit_and_output():
    done = run_bounded([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], 30)
    assert (done.rc, done.out.strip(), done.err.strip(), done.hung) == (3, "out", "err", False)


def test_a_try_past_its_bound_is_stopped_with_what_it_started_in_the_background(tmp_path):
    pids = tmp_path / "pids"
    # The manager's stand-in starts a method in the background and waits on it forever.
    started = time.monotonic()
    done = run_bounded(["sh", "-c", f"sleep 300 & echo $! > {pids}; sleep 301 & echo $! >> {pids}; wait"], 1, grace=2)
    assert done.hung and done.rc is None
    assert time.monotonic() - started < 10
    assert done.stopped >= 3  # the shell and its two sleeps
    for pid in map(int, pids.read_text().split()):
        assert wait_gone(pid), f"{pid} outlived its try"


def test_what_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    pid_file = tmp_path / "pid"
    script = (f"import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)")
    done = run_bounded([sys.executable, "-c", script], 1, grace=0.5)
    assert done.hung
    assert wait_gone(int(pid_file.read_text()))


def test_a_grandchild_in_its_own_session_is_not_the_try_s_and_is_left(tmp_path):
    """The bound stops the try's session: what daemonized out of it (as a service apt starts
    through invoke-rc.d would) is not killed."""
    pid_file = tmp_path / "pid"
    done = run_bounded(["sh", "-c", f"setsid sleep 300 < /dev/null > /dev/null 2>&1 & echo $! > {pid_file}; sleep 300"],
                       1, grace=1)
    assert done.hung
    pid = int(pid_file.read_text())
    try:
        time.sleep(0.3)
        assert alive(pid)
    finally:
        os.kill(pid, 9)


class Node:
    """Answers as the package tools of a node would; records every command."""

    def __init__(self, installed: dict[str, str], offered: dict[str, list[str]], rpm: bool = False):
        self.installed, self.offered, self.rpm = dict(installed), offered, rpm
        self.commands: list[list[str]] = []
        self.script: dict[str, list[str]] = {}  # tool step -> outcomes in order: ok, hang, busy, fail
        self.read_again = False
        self.status: dict[str, str] = {}  # dpkg's Status-Abbrev where not "ii "

    def step(self, name: str) -> str:
        queue = self.script.get(name, [])
        return queue.pop(0) if queue else "ok"

    def __call__(self, argv: list[str], bound: float) -> Try:
        self.commands.append(argv)
        tool = argv[0]
        if tool == "dpkg-query":
            names = argv[3:]
            return Try(argv, 0 if all(n in self.installed for n in names) else 1, 0.1,
                       "".join(f"{n}\t{self.installed[n]}\t{self.status.get(n, 'ii ')}\n"
                               for n in names if n in self.installed))
        if tool == "rpm":
            names = argv[4:]
            return Try(argv, 0, 0.1, "".join(f"{n}\t{self.installed[n]}\n" if n in self.installed
                                             else f"package {n} is not installed\n" for n in names))
        if tool == "apt-cache":
            lines = [f"{n} | {v} | http://mirror ./ Packages" for n in argv[2:] for v in self.offered.get(n, [])
                     if self.read_again or not v.endswith("+new")]
            return Try(argv, 0, 0.1, "\n".join(lines) + "\n")
        step = "refresh" if argv[-1] in ("update", "makecache") else argv[argv.index("install") if "install" in argv
                                                                           else argv.index("downgrade")]
        outcome = self.step(step)
        if outcome == "hang":
            return Try(argv, None, bound, stopped=4)
        if outcome == "busy":
            return Try(argv, 100, 0.2, "", "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 7")
        if outcome == "fail":
            return Try(argv, 100, 0.2, "", "E: Version '9.9' for 'kubeadm' was not found")
        if step == "refresh":
            self.read_again = True
        else:
            for spec in argv[argv.index(step) + 1:]:
                name, _, version = spec.partition("-" if self.rpm else "=")
                if self.rpm and step == "install" and name in self.installed:
                    continue  # dnf install does not move an installed package down
                self.installed[name] = version or "1.0"
        return Try(argv, 0, 1.0, "done")


OPTIONS = {"refresh": "auto", "install_recommends": False, "allow_held": True, "allow_downgrade": False,
           "try_timeout": 300, "tries": 3, "delay": 5}
KUBE = [Wanted("kubeadm", "1.36.3-1.1"), Wanted("kubelet", "1.36.3-1.1")]


def run(node: Node, wanted=KUBE, check_mode=False, manager=None, **options):
    sleeps: list[float] = []
    outcome = converge(manager or Apt(), wanted, {**OPTIONS, **options}, check_mode, node, sleep=sleeps.append)
    return outcome, sleeps


def managers(node: Node) -> list[list[str]]:
    return [c for c in node.commands if c[0] in ("apt-get", "dnf")]


def test_everything_at_its_version_runs_no_package_manager_and_changes_nothing():
    node = Node({"kubeadm": "1.36.3-1.1", "kubelet": "1.36.3-1.1"}, {})
    outcome, _ = run(node)
    assert (outcome.changed, outcome.failed, managers(node)) == (False, False, [])


def test_a_missing_version_the_sources_offer_is_installed_without_reading_them_again():
    node = Node({"kubeadm": "1.35.4-1.1"}, {"kubeadm": ["1.36.3-1.1"], "kubelet": ["1.36.3-1.1"]})
    outcome, _ = run(node)
    assert outcome.changed and not outcome.failed
    assert [c[-3:] for c in managers(node)] == [["install", "kubeadm=1.36.3-1.1", "kubelet=1.36.3-1.1"]]
    assert "--allow-change-held-packages" in managers(node)[0] and "--no-install-recommends" in managers(node)[0]
    assert outcome.installed == {"kubeadm": "1.36.3-1.1", "kubelet": "1.36.3-1.1"}


def test_a_version_the_sources_do_not_offer_yet_reads_them_again_first():
    node = Node({}, {"kubeadm": ["1.36.3-1.1+new"], "kubelet": ["1.36.3-1.1+new"]})
    wanted = [Wanted("kubeadm", "1.36.3-1.1+new"), Wanted("kubelet", "1.36.3-1.1+new")]
    outcome, _ = run(node, wanted)
    assert [c[-1] for c in managers(node)] == ["update", "kubelet=1.36.3-1.1+new"]
    assert not outcome.failed


def test_refresh_always_reads_the_sources_even_with_nothing_to_install():
    node = Node({}, {})
    outcome, _ = run(node, wanted=[], refresh="always")
    assert outcome.changed and [c[-1] for c in managers(node)] == ["update"]


def test_a_hung_try_is_tried_again_and_each_try_is_reported():
    node = Node({}, {"kubeadm": ["1.36.3-1.1"], "kubelet": ["1.36.3-1.1"]})
    node.script["install"] = ["hang"]
    outcome, sleeps = run(node)
    assert not outcome.failed and len(managers(node)) == 2 and sleeps == [5.0]
    assert outcome.tries[0].startswith("installing kubeadm, kubelet try 1: stopped at 300 s with the 4 processes")
    assert outcome.tries[1].startswith("installing kubeadm, kubelet try 2: exit 0")


def test_a_manager_that_hangs_on_every_try_fails_after_its_tries_naming_the_hang():
    node = Node({}, {"kubeadm": ["1.36.3-1.1"], "kubelet": ["1.36.3-1.1"]})
    node.script["install"] = ["hang"] * 3
    outcome, sleeps = run(node, tries=3, try_timeout=20)
    assert outcome.failed and outcome.hung_tries == 3 and len(managers(node)) == 3 and sleeps == [5.0, 5.0]
    assert "apt-get (installing kubeadm, kubelet) did not finish in 20 s on 3 of 3 tries" in outcome.msg
    assert "stopped with every process it started" in outcome.msg
    # Facts only: what to do about a hang is the operator's view's to say (translate's fix), and
    # where packages come from is no answer to a hang.
    assert "ps -ef" not in outcome.msg and "dpkg --configure" not in outcome.msg


def test_only_the_tries_that_hung_count_as_hung():
    # apt's lock held twice, then a hang on the last try: one try hung, not three.
    node = Node({}, {"kubeadm": ["1.36.3-1.1"], "kubelet": ["1.36.3-1.1"]})
    node.script["install"] = ["busy", "busy", "hang"]
    outcome, sleeps = run(node, tries=3, try_timeout=20)
    assert outcome.failed and outcome.hung_tries == 1 and len(managers(node)) == 3, outcome
    assert "did not finish in 20 s on 1 of 3 tries" in outcome.msg, outcome.msg
    # A hang, then the lock on the last try: the step failed on the lock, not on a hang.
    node = Node({}, {"kubeadm": ["1.36.3-1.1"], "kubelet": ["1.36.3-1.1"]})
    node.script["install"] = ["hang", "busy"]
    outcome, _ = run(node, tries=2, try_timeout=20)
    assert outcome.failed and outcome.hung_tries == 0 and "exit" in outcome.msg, outcome.msg


def test_a_failure_that_is_not_a_hang_says_where_the_packages_must_come_from():
    node = Node({}, {"kubeadm": ["1.36.3-1.1"], "kubelet": ["1.36.3-1.1"]})
    node.script["install"] = ["fail"]
    outcome, _ = run(node, hint="Set gpuboot.mirror.packages_url.")
    assert outcome.failed and outcome.msg.endswith("was not found. Set gpuboot.mirror.packages_url."), outcome.msg
    node = Node({}, {"kubeadm": ["1.36.3-1.1"], "kubelet": ["1.36.3-1.1"]})
    node.script["install"] = ["hang"] * 3
    outcome, _ = run(node, hint="Set gpuboot.mirror.packages_url.")
    assert outcome.hung_tries == 3 and "packages_url" not in outcome.msg, outcome.msg


def test_apt_s_lock_held_by_another_is_waited_out_and_a_real_error_is_not_tried_again():
    node = Node({}, {"kubeadm": ["1.36.3-1.1"], "kubelet": ["1.36.3-1.1"]})
    node.script["install"] = ["busy", "ok"]
    outcome, _ = run(node)
    assert not outcome.failed and len(managers(node)) == 2
    node = Node({}, {"kubeadm": ["1.36.3-1.1"], "kubelet": ["1.36.3-1.1"]})
    node.script["install"] = ["fail", "ok"]
    outcome, _ = run(node)
    assert outcome.failed and not outcome.hung_tries and len(managers(node)) == 1
    assert "exit 100" in outcome.msg and "Version '9.9' for 'kubeadm' was not found" in outcome.msg


def test_a_held_package_counts_as_installed_and_a_half_installed_one_does_not():
    node = Node({"kubeadm": "1.36.3-1.1", "kubelet": "1.36.3-1.1"}, {"kubelet": ["1.36.3-1.1"]})
    node.status = {"kubeadm": "hi ", "kubelet": "iF "}  # held; half-configured
    outcome, _ = run(node)
    assert [c[-1] for c in managers(node)] == ["kubelet=1.36.3-1.1"]


def test_a_dry_run_says_what_would_change_and_runs_no_package_manager():
    node = Node({}, {"kubeadm": ["1.36.3-1.1"], "kubelet": ["1.36.3-1.1"]})
    outcome, _ = run(node, check_mode=True)
    assert outcome.changed and managers(node) == []


def test_a_version_prefix_matches_and_an_unversioned_package_takes_any():
    node = Node({"chrony": "4.3-2", "containerd.io": "2.3.7-1"}, {})
    outcome, _ = run(node, [Wanted("chrony"), Wanted("containerd.io", "2.3.7*")])
    assert not outcome.changed and managers(node) == []


def test_dnf_installs_then_moves_down_what_install_left_above_its_version():
    node = Node({"containerd.io": "2.4.2-1.el9"}, {}, rpm=True)
    outcome, _ = run(node, [Wanted("containerd.io", "2.3.7-1.el9")], manager=Dnf(), allow_downgrade=True)
    assert [c[3] for c in managers(node)] == ["install", "downgrade"]
    assert "--disableexcludes=main" in managers(node)[0]
    assert not outcome.failed and outcome.installed == {"containerd.io": "2.3.7-1.el9"}


def test_a_package_left_off_its_version_fails_naming_it():
    node = Node({"containerd.io": "2.4.2-1.el9"}, {}, rpm=True)
    outcome, _ = run(node, [Wanted("containerd.io", "2.3.7-1.el9")], manager=Dnf())
    assert outcome.failed
    assert outcome.msg == "dnf finished, yet containerd.io is 2.4.2-1.el9 (wanted 2.3.7-1.el9)"


@pytest.mark.parametrize("wanted,installed,met", [
    (Wanted("a", "1.0-1"), "1.0-1", True), (Wanted("a", "1.0-1"), "1.0-10", False), (Wanted("a", "1.0*"), "1.0-10", True),
    (Wanted("a"), "0.1", True), (Wanted("a"), None, False)])
def test_what_meets_a_wanted_version(wanted, installed, met):
    assert wanted.met_by(installed) is met
