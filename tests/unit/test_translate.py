"""Runner event dicts (shaped as ansible-runner 2.4 emits them) -> typed events."""
from __future__ import annotations

from gpuboot.ansible.translate import translate
from gpuboot.events import HostCounts, HostResult, PlaybookStats, PlayStarted, TaskStarted


def ev(kind, **data):
    return {"event": kind, "uuid": "x", "counter": 1, "event_data": data}


def test_play_and_task_start():
    assert translate(ev("playbook_on_play_start", play="Preflight")) == PlayStarted("Preflight")
    assert translate(ev("playbook_on_task_start", task="Preflight | x")) == TaskStarted("Preflight | x")


def test_ok_changed_failed_unreachable_skipped():
    assert translate(ev("runner_on_ok", host="h1", task="t", res={"changed": False})).status == "ok"
    assert translate(ev("runner_on_ok", host="h1", task="t", res={"changed": True})).status == "changed"
    failed = translate(ev("runner_on_failed", host="h1", task="t", res={"msg": "boom", "rc": 2}))
    assert failed == HostResult("h1", "t", "failed", "boom")
    ignored = translate(ev("runner_on_failed", host="h1", task="t", ignore_errors=True, res={"msg": "meh"}))
    assert ignored.status == "ignored"
    unreachable = translate(ev("runner_on_unreachable", host="h2", task="t",
                               res={"msg": "Failed to connect", "unreachable": True}))
    assert unreachable.status == "unreachable" and "Failed to connect" in unreachable.message
    assert translate(ev("runner_on_skipped", host="h1", task="t")).status == "skipped"


def test_no_log_results_stay_censored():
    event = translate(ev("runner_on_failed", host="h1", task="join", res={
        "censored": "the output has been hidden due to the fact that 'no_log: true' was specified for this result"}))
    assert "no_log" in event.message


def test_failed_loop_item_message_is_found():
    event = translate(ev("runner_on_failed", host="h1", task="t", res={
        "results": [{"failed": False}, {"failed": True, "msg": "item two broke"}]}))
    assert event.message == "item two broke"


def test_long_messages_are_kept_whole():
    """A preflight summary lists every problem on every host: cutting it loses the fix."""
    summary = "\n".join(f"gpu{i:02d}: /var has 3 GiB free, needs 50 GiB (free space on /var)" for i in range(40))
    event = translate(ev("runner_on_failed", host="h1", task="t", res={"msg": summary}))
    assert event.message == summary


def test_gpuboot_modules_return_structured_data():
    event = translate(ev("runner_on_ok", host="h1", task="t", res={"changed": False, "gpuboot_result": {"a": []}}))
    assert event.data == {"a": []} and event.status == "ok"


def test_stats():
    stats = translate(ev("playbook_on_stats", ok={"h1": 5, "h2": 3}, changed={"h1": 2}, failures={"h2": 1},
                         dark={}, skipped={"h1": 1}, ignored={}))
    assert stats == PlaybookStats({"h1": HostCounts(ok=5, changed=2, skipped=1), "h2": HostCounts(ok=3, failed=1)})


def test_other_events_are_ignored():
    assert translate(ev("verbose")) is None
    assert translate({"event": "runner_item_on_ok", "event_data": {}}) is None


CHANGED_KEY = """Failed to connect to the host via ssh: @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Offending ED25519 key in /home/ops/.ssh/known_hosts:7
Host key verification failed."""


def test_a_changed_host_key_is_refused_with_the_fix_and_never_the_switch():
    unreachable = translate(ev("runner_on_unreachable", host="gpu07", task="t",
                               res={"msg": CHANGED_KEY, "unreachable": True}))
    assert unreachable.status == "unreachable" and "REMOTE HOST IDENTIFICATION HAS CHANGED" in unreachable.message
    fix = unreachable.message.split("\nfix: ", 1)[1]
    assert "line 7 of /home/ops/.ssh/known_hosts" in fix and "ssh-keygen -R" in fix and "out of band" in fix
    assert "not the fix" in fix
    unknown = translate(ev("runner_on_unreachable", host="gpu08", task="t",
                           res={"msg": "Failed to connect: Host key verification failed.", "unreachable": True}))
    assert "its line in known_hosts" in unknown.message
    plain = translate(ev("runner_on_unreachable", host="gpu09", task="t", res={"msg": "Connection timed out"}))
    assert "fix:" not in plain.message


def test_a_failed_command_says_what_the_command_said():
    """"non-zero return code" alone names no cause: the command's last stderr lines follow it."""
    stderr = "\n".join(f"retry {i}" for i in range(30)) + "\nError from server: etcdserver: leader changed"
    event = translate(ev("runner_on_failed", host="cp1", task="t", res={
        "msg": "non-zero return code", "rc": 1, "stderr": stderr, "stdout": ""}))
    lines = event.message.splitlines()
    assert lines[0] == "non-zero return code" and lines[1] == "[11 earlier lines in the log]"
    assert lines[-1] == "Error from server: etcdserver: leader changed" and len(lines) == 22
    quiet = translate(ev("runner_on_failed", host="cp1", task="t", res={
        "msg": "non-zero return code", "rc": 3, "stderr": "", "stdout": "member 8e9e05c52164694d not found"}))
    assert quiet.message == "non-zero return code\nmember 8e9e05c52164694d not found"
    # A module's own message that already quotes the output is not repeated.
    said = translate(ev("runner_on_failed", host="cp1", task="t", res={"msg": "boom: bad", "rc": 1, "stderr": "bad"}))
    assert said.message == "boom: bad"


def test_a_full_disk_says_which_node_and_where_the_phases_write():
    # apt's own words on a node whose /var filled up (seen in the lab's full-/var test).
    apt = ("E:Write error - write (28: No space left on device), E:IO Error saving source cache, "
           "E:The package lists or status file could not be parsed or opened.")
    event = translate(ev("runner_on_failed", host="gpu07", task="OS prep | install chrony", res={"msg": apt}))
    assert event.message.startswith(apt)
    assert "fix: gpu07 is out of disk space" in event.message and "On gpu07: df -h /var" in event.message
    assert "/var/cache/apt" in event.message and "/var/lib/containerd" in event.message
    dpkg = "You don't have enough free space in /var/cache/apt/archives/."
    assert "out of disk space" in translate(ev("runner_on_failed", host="h", task="t", res={"msg": dpkg})).message
    # Other failures, and failures that were ignored, get no such advice.
    assert "disk space" not in translate(ev("runner_on_failed", host="h", task="t", res={"msg": "boom"})).message
    ignored = translate(ev("runner_on_failed", host="h", task="t", ignore_errors=True, res={"msg": apt}))
    assert "disk space" not in ignored.message


def test_a_step_past_its_timeout_says_where_it_hung_and_that_a_rerun_is_safe():
    # ansible-core's result for a task that ran past its `timeout` (the package tasks have one).
    res = {"msg": "Task failed: Timed out after 900 second(s).", "timedout": {"frame": "...", "period": 900}}
    event = translate(ev("runner_on_failed", host="w1", task="Kubernetes packages | install", res=res))
    assert event.message.startswith("Task failed: Timed out after 900 second(s).")
    assert "did not finish on w1 in 900 s" in event.message and "On w1, see what it was waiting on" in event.message
    assert "run gpuboot up again" in event.message
    # A failure that is not a timeout gets no such advice.
    assert "did not finish" not in translate(ev("runner_on_failed", host="w1", task="t", res={"msg": "boom"})).message


def test_a_package_try_stopped_after_its_time_says_so_with_its_tries():
    # gpuboot_packages' result when every try of a step passed its bound.
    res = {"msg": "apt-get (installing containerd.io) did not finish in 300 s on 3 of 3 tries; ...", "failed": True,
           "hung_tries": 3, "tries": ["reading the sources try 1: exit 0 in 2.0 s"]
           + [f"installing containerd.io try {n}: stopped at 300 s with the 5 processes it had started" for n in (1, 2, 3)]}
    event = translate(ev("runner_on_failed", host="cp2", task="Container runtime | install containerd", res=res))
    assert event.message.startswith("apt-get (installing containerd.io) did not finish")
    assert "did not finish on cp2 in its time on 3 of its tries" in event.message
    assert "dpkg --configure -a" in event.message
    # A package step that failed otherwise gets no such advice.
    res = {"msg": "apt-get (installing x) failed with exit 100: E: Version '9' for 'x' was not found", "failed": True,
           "hung_tries": 0, "tries": ["installing x try 1: exit 100 in 0.4 s"]}
    assert "did not finish" not in translate(ev("runner_on_failed", host="cp2", task="t", res=res)).message
