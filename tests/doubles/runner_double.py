"""A TEST DOUBLE for gpuboot.ansible.runner.run_playbook, for engine unit tests only.

It checks its inputs as strictly as the real adapter needs them (playbook and inventory
exist, extravars are plain JSON data, host-key checking is stated explicitly) and replays
scripted runner events through the real translator. Integration tests use the real runner."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpuboot.ansible.runner import PlaybookResult, PlaybookRun
from gpuboot.ansible.translate import translate


@dataclass
class ScriptedPhase:
    hosts: dict[str, str]  # host -> "ok" | "changed" | "failed" | "unreachable"
    message: str = "scripted failure"
    wait_for_cancel: bool = False


@dataclass
class RunnerDouble:
    script: dict[str, ScriptedPhase] = field(default_factory=dict)
    calls: list[PlaybookRun] = field(default_factory=list)

    def __call__(self, request: PlaybookRun, on_event, cancel: threading.Event) -> PlaybookResult:
        assert request.playbook.is_file(), request.playbook
        assert request.inventory.is_file(), request.inventory
        json.dumps(request.extravars)  # must be data, not strings to splice into a command line
        assert request.envvars.get("ANSIBLE_HOST_KEY_CHECKING") in ("True", "False")
        self.calls.append(request)
        phase = self.script.get(request.ident, ScriptedPhase({}))
        raw = [{"event": "playbook_on_task_start", "event_data": {"task": f"{request.ident} | work"}}]
        stats = {"ok": {}, "changed": {}, "failures": {}, "dark": {}}
        for host, status in phase.hosts.items():
            kind = {"ok": "runner_on_ok", "changed": "runner_on_ok", "failed": "runner_on_failed",
                    "unreachable": "runner_on_unreachable"}[status]
            res = {"changed": status == "changed", "msg": phase.message if status in ("failed", "unreachable") else ""}
            raw.append({"event": kind, "event_data": {"host": host, "task": f"{request.ident} | work", "res": res}})
            key = {"ok": "ok", "changed": "changed", "failed": "failures", "unreachable": "dark"}[status]
            stats[key][host] = 1
        raw.append({"event": "playbook_on_stats", "event_data": stats})
        for item in raw:
            event = translate(item)
            if event is not None:
                on_event(event)
        if phase.wait_for_cancel:
            assert cancel.wait(10), "engine never cancelled"
            return PlaybookResult("canceled", 254, Path("/dev/null"))
        failed = any(s in ("failed", "unreachable") for s in phase.hosts.values())
        return PlaybookResult("failed" if failed else "successful", 2 if failed else 0, Path("/dev/null"))
