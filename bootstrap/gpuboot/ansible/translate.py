"""ansible-runner event dicts -> typed events. Pure: no runner import, easy to test."""
from __future__ import annotations

import re
from typing import Any

from gpuboot.events import Event, HostCounts, HostResult, PlaybookStats, PlayStarted, TaskStarted


def _message(res: Any) -> str:
    """The part of a module result a person needs; never the whole result."""
    if not isinstance(res, dict):
        return ""
    if res.get("censored"):
        return str(res["censored"])
    for key in ("msg", "stderr", "reason", "exception"):
        value = res.get(key)
        if value:
            # Whole: a summary that lists every problem is useless cut short.
            text = (value if isinstance(value, str) else str(value)).strip()
            if key == "msg" and "rc" in res:
                text += _command_output(res, text)
            return text
    results = res.get("results")
    if isinstance(results, list):
        for item in results:
            if isinstance(item, dict) and item.get("failed"):
                return _message(item)
    return ""


_OUTPUT_LINES = 20


def _command_output(res: dict, said: str) -> str:
    """A command's own words under the module's "non-zero return code": its stderr, else its
    stdout, the last lines (where the error is), unless the message already holds them."""
    for key in ("stderr", "stdout"):
        value = res.get(key)
        if isinstance(value, str) and value.strip() and value.strip() not in said:
            lines = value.strip().splitlines()
            cut = f"[{len(lines) - _OUTPUT_LINES} earlier lines in the log]\n" if len(lines) > _OUTPUT_LINES else ""
            return "\n" + cut + "\n".join(lines[-_OUTPUT_LINES:])
    return ""


# ssh's own words when a host's key is not the one known_hosts holds.
_CHANGED_KEY = re.compile(r"Offending \S+ key in (\S+):(\d+)")


def _host_key_fix(message: str) -> str:
    """What to do when ssh refused a host for its key (host-key checking stays on)."""
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" not in message and "Host key verification failed" not in message:
        return ""
    offending = _CHANGED_KEY.search(message)
    where = f"line {offending.group(2)} of {offending.group(1)}" if offending else "its line in known_hosts"
    return (f"\nfix: the host's SSH key is not the one known_hosts holds. If the node was reinstalled, confirm "
            f"its new key out of band (its console: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), remove "
            f"{where} (ssh-keygen -R ADDRESS -f FILE) and add the confirmed key; otherwise treat it as an "
            f"attack. Turning host-key checking off is not the fix.")


# ssh's words for a host that does not answer at all.
_SILENT = re.compile(r"Connection timed out|No route to host|Connection refused|Operation timed out")


def _silent_host_fix(host: str, message: str) -> str:
    if "Failed to connect to the host via ssh" not in message or not _SILENT.search(message):
        return ""
    return (f"\nfix: {host} does not answer on SSH: see that it is powered on, that its network and any "
            f"firewall between let SSH through (ssh -v to it from here), and that sshd runs on it. Once it "
            f"answers, run gpuboot again: the phase it was in runs again, and a join cut off halfway is reset "
            f"and done again.")


# A full filesystem, in the words of the kernel (ENOSPC), apt and dpkg.
_NO_SPACE = re.compile(r"No space left on device|\(28: |You don't have enough free space")


def _no_space_fix(host: str, message: str) -> str:
    """Which filesystem filled up is the node's to tell: where the phases write, and how to look."""
    if not _NO_SPACE.search(message):
        return ""
    return (f"\nfix: {host} is out of disk space. The phases write under /var: apt in /var/cache/apt and "
            f"/var/lib/apt, containerd's images in /var/lib/containerd, kubelet in /var/lib/kubelet, etcd in "
            f"/var/lib/etcd, gpuboot's records in /var/lib/gpuboot. On {host}: df -h /var /var/lib/containerd "
            f"/tmp shows which is full. Free space there, then run gpuboot up again.")


def _timed_out_fix(host: str, res: Any) -> str:
    """A step that ran past its time: what hung is on the host, and the phase is safe to run again."""
    if not isinstance(res, dict):
        return ""
    if isinstance(res.get("timedout"), dict):
        bound = f"in {res['timedout'].get('period', 'its')} s"
    elif isinstance(hung := res.get("hung_tries"), int) and hung > 0:
        # gpuboot_packages: the step's last try (and maybe others) passed its bound and was stopped whole.
        bound = f"in its time on {hung} of its tries" if hung > 1 else "in its time on its last try"
    else:
        return ""
    return (f"\nfix: the step did not finish on {host} {bound} and was stopped. On {host}, see what it "
            f"was waiting on: ps -ef --forest (a stuck apt, dpkg or dnf and its helpers), journalctl -n 50, and "
            f"whether its package source answers. Stop what is stuck (a package manager left mid-run: dpkg "
            f"--configure -a), then run gpuboot up again: the phase runs again from its start.")


def _host_result(data: dict, status: str) -> HostResult:
    res = data.get("res")
    message = _message(res) if status in ("failed", "unreachable", "ignored") else ""
    if status == "unreachable":
        message += _host_key_fix(message) + _silent_host_fix(str(data.get("host", "?")), message)
    if status == "failed":
        message += _no_space_fix(str(data.get("host", "?")), message) + _timed_out_fix(str(data.get("host", "?")), res)
    if status == "ok" and isinstance(res, dict) and res.get("gpuboot_notice"):
        # What a phase tells the operator without failing (`debug: var: gpuboot_notice`).
        message = str(res["gpuboot_notice"])
    return HostResult(
        host=str(data.get("host", "?")),
        task=str(data.get("task", "")),
        status=status,  # type: ignore[arg-type]
        message=message,
        # gpuboot's own modules return structured data under this key (never secrets).
        data=res.get("gpuboot_result") if isinstance(res, dict) else None,
    )


def translate(raw: dict) -> Event | None:
    kind = raw.get("event")
    data = raw.get("event_data") or {}
    if kind == "playbook_on_play_start":
        return PlayStarted(play=str(data.get("play", "")))
    if kind == "playbook_on_task_start":
        return TaskStarted(task=str(data.get("task", "")))
    if kind == "runner_on_ok":
        changed = bool((data.get("res") or {}).get("changed"))
        return _host_result(data, "changed" if changed else "ok")
    if kind == "runner_on_failed":
        return _host_result(data, "ignored" if data.get("ignore_errors") else "failed")
    if kind == "runner_on_unreachable":
        return _host_result(data, "unreachable")
    if kind == "runner_on_skipped":
        return _host_result(data, "skipped")
    if kind == "playbook_on_stats":
        hosts: dict[str, dict[str, int]] = {}
        for field, key in (("ok", "ok"), ("changed", "changed"), ("failures", "failed"),
                           ("dark", "unreachable"), ("skipped", "skipped"), ("ignored", "ignored")):
            for host, count in (data.get(field) or {}).items():
                hosts.setdefault(host, {})[key] = int(count)
        return PlaybookStats(hosts={h: HostCounts(**c) for h, c in sorted(hosts.items())})
    return None
