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


STATE_TASKS = {"lock": "Gpuboot state | take the cluster lock",
               "probe": "Gpuboot state | check each phase's result",
               "record": "Gpuboot state | record each phase's result",
               "release": "Gpuboot state | release the cluster lock"}


@dataclass
class Hosts:
    """What the double's hosts show: per host, the phase records gpuboot_phase_state wrote
    (phase -> fingerprint), results a test has broken, and the lock file on the first
    control plane."""

    records: dict[str, dict[str, str]] = field(default_factory=dict)
    broken: dict[tuple[str, str], str] = field(default_factory=dict)  # (host, phase) -> why
    full: set[str] = field(default_factory=set)  # hosts whose /var is full: no record can be written
    lock: dict | None = None


@dataclass
class RunnerDouble:
    script: dict[str, ScriptedPhase] = field(default_factory=dict)
    calls: list[PlaybookRun] = field(default_factory=list)
    hosts: Hosts = field(default_factory=Hosts)

    def _state(self, request: PlaybookRun) -> list[dict]:
        """gpuboot_state.yml as the real modules answer it."""
        extra = request.extravars
        action = extra["gpuboot_state_action"]
        assert action in ("begin", "end"), action
        first, holder = extra["gpuboot_lock_host"], extra["gpuboot_lock_holder"]
        assert {"run_id", "who", "where", "pid", "since"} <= set(holder)
        events = []

        def ok(host, task, result, changed=False):
            events.append({"event": "runner_on_ok", "event_data": {
                "host": host, "task": task, "res": {"changed": changed, "gpuboot_result": result}}})

        for entry in extra["gpuboot_state_phases"]:
            assert {"name", "fingerprint", "hosts", "files", "present", "services"} <= set(entry), entry
        by_host: dict[str, list[dict]] = {}
        for entry in extra["gpuboot_state_phases"]:
            for host in entry["hosts"]:
                by_host.setdefault(host, []).append(entry)
        if action == "begin":
            lock = self.hosts.lock
            if lock is None or lock["run_id"] in extra.get("gpuboot_lock_takeover", []) or lock["run_id"] == holder["run_id"]:
                self.hosts.lock = holder
                ok(first, STATE_TASKS["lock"], {"acquired": True, "holder": holder}, changed=True)
            else:
                ok(first, STATE_TASKS["lock"], {"acquired": False, "holder": lock})
            for host, entries in by_host.items():
                answer = {}
                for entry in entries:
                    recorded = self.hosts.records.get(host, {}).get(entry["name"])
                    why = [] if recorded == entry["fingerprint"] else ["no record of this phase on the host"]
                    if (host, entry["name"]) in self.hosts.broken:
                        why.append(self.hosts.broken[(host, entry["name"])])
                    answer[entry["name"]] = why
                ok(host, STATE_TASKS["probe"], answer)
        else:
            for host, entries in by_host.items():
                if host in self.hosts.full:
                    # gpuboot_phase_state's own words on ENOSPC.
                    directory = "/var/lib/gpuboot/phases"
                    events.append({"event": "runner_on_failed", "event_data": {
                        "host": host, "task": STATE_TASKS["record"], "res": {"failed": True, "msg": (
                            f"cannot record phase {entries[0]['name']} in {directory}/{entries[0]['name']}.json.tmp: "
                            f"No space left on device; free space there (df -h {directory}), then run gpuboot up again")}}})
                    continue
                for entry in entries:
                    self.hosts.records.setdefault(host, {})[entry["name"]] = entry["fingerprint"]
                    self.hosts.broken.pop((host, entry["name"]), None)
                ok(host, STATE_TASKS["record"], {"recorded": [e["name"] for e in entries]}, changed=True)
            mine = self.hosts.lock is not None and (self.hosts.lock["run_id"] == holder["run_id"]
                                                   or extra.get("gpuboot_lock_force"))
            released = self.hosts.lock if mine else None
            if mine:
                self.hosts.lock = None
            ok(first, STATE_TASKS["release"], {"released": bool(mine), "holder": released})
        return events

    def __call__(self, request: PlaybookRun, on_event, cancel: threading.Event) -> PlaybookResult:
        assert request.playbook.is_file(), request.playbook
        assert request.inventory.is_file(), request.inventory
        json.dumps(request.extravars)  # must be data, not strings to splice into a command line
        assert request.envvars.get("ANSIBLE_HOST_KEY_CHECKING") in ("True", "False")
        assert "gpuboot_settings" in request.extravars and "gpuboot_nodes" in request.extravars
        self.calls.append(request)
        if request.ident.startswith("state-"):
            assert request.playbook.name == "gpuboot_state.yml"
            assert not request.limit, "gpuboot's own state runs (lock, probe, record) are never limited"
            for item in self._state(request):
                on_event(translate(item))
            return PlaybookResult("successful", 0, Path("/dev/null"))
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
