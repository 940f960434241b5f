"""ansible-runner event dicts -> typed events. Pure: no runner import, easy to test."""
from __future__ import annotations

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
            return (value if isinstance(value, str) else str(value)).strip()
    results = res.get("results")
    if isinstance(results, list):
        for item in results:
            if isinstance(item, dict) and item.get("failed"):
                return _message(item)
    return ""


def _host_result(data: dict, status: str) -> HostResult:
    res = data.get("res")
    return HostResult(
        host=str(data.get("host", "?")),
        task=str(data.get("task", "")),
        status=status,  # type: ignore[arg-type]
        message=_message(res) if status in ("failed", "unreachable", "ignored") else "",
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
