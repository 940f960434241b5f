"""Runs playbooks on the control machine; with executors.py (the same runs streamed to
execution nodes), the only modules that import ansible_runner.

A PlaybookRun is data: the inventory path and extravars are passed as such (never as
`-e key=value` strings), env files are suppressed so nothing secret is written beside
the artifacts, and every runner event is translated into a typed event."""
from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ansible_runner

from gpuboot import processes
from gpuboot.ansible.translate import translate
from gpuboot.events import Event
from gpuboot.files import write_private


@dataclass(frozen=True)
class PlaybookRun:
    playbook: Path
    inventory: Path
    artifact_dir: Path
    ident: str
    extravars: dict = field(default_factory=dict)
    envvars: dict = field(default_factory=dict)
    forks: int = 5
    check: bool = False
    diff: bool = False
    verbosity: int = 0
    fact_cache: Path | None = None  # shared by every phase of one run: facts gathered once
    limit: tuple[str, ...] = ()  # hosts, as ansible-playbook --limit (gpuboot node add|remove)

    @property
    def inventory_dir(self) -> Path:
        """The folder relative paths in the inventory's settings start from."""
        return self.inventory if self.inventory.is_dir() else self.inventory.parent

    @property
    def cmdline(self) -> str | None:
        """ansible-playbook's mode flags for this run (a dry run, a diff)."""
        return " ".join(flag for flag, on in (("--check", self.check), ("--diff", self.diff)) if on) or None


@dataclass(frozen=True)
class PlaybookResult:
    status: str  # successful, failed, canceled, timeout
    rc: int
    stdout_path: Path

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0


# ansible-runner records the whole process environment in artifacts/<ident>/command;
# an operator's shell may hold tokens, so only these keys survive in that record.
RECORDED_ENV = ("PATH", "HOME", "LANG", "PWD")
# What ansible-playbook gets of gpuboot's environment: nothing else, so that a token or a
# password an operator keeps in the shell never reaches the playbook's process or the
# `command` record ansible-runner writes when the run starts (a SIGKILL leaves it behind).
PLAYBOOK_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "PWD", "SHELL",
                "SSH_AUTH_SOCK", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED")
PLAYBOOK_ENV_PREFIXES = ("ANSIBLE_", "GPUBOOT_", "LC_", "XDG_", "RUNNER_", "PROFILE_TASKS_")


def playbook_environment(env: dict[str, str], shell: dict[str, str]) -> dict[str, str]:
    """`env` without what it took from the operator's `shell` beyond PLAYBOOK_ENV; what
    ansible-runner and gpuboot set themselves (its callback's variables, envvars) stays."""
    return {k: v for k, v in env.items()
            if k in PLAYBOOK_ENV or k.startswith(PLAYBOOK_ENV_PREFIXES) or shell.get(k) != v}


def _trim_environment(status: dict, runner_config) -> None:
    """ansible-runner's status handler: called with `starting` before it records the command
    and spawns ansible-playbook, so both see only the playbook's environment."""
    if status.get("status") == "starting":
        runner_config.env = playbook_environment(runner_config.env, dict(os.environ))


def _path_with_this_python() -> str:
    """PATH with this environment's bin/ first, so its ansible-playbook is the one that runs."""
    here = os.path.dirname(sys.executable)
    return os.pathsep.join([here, os.environ.get("PATH", "")])


def scrub_command_record(path: Path) -> None:
    """ansible-runner's record of the command, with only RECORDED_ENV and ANSIBLE_* kept."""
    if not path.exists():
        return
    record = json.loads(path.read_text())
    env = record.get("env") or {}
    record["env"] = {k: v for k, v in env.items() if k.startswith("ANSIBLE_") or k in RECORDED_ENV}
    path.write_text(json.dumps(record))


def _extravars_file(request: PlaybookRun) -> str | None:
    """Extra variables go to ansible-playbook as a file (`-e @file`): the settings of a
    2,000-node inventory are larger than one command-line argument may be (128 KiB)."""
    if not request.extravars:
        return None
    path = request.artifact_dir / f"{request.ident}.extravars.json"
    write_private(path, json.dumps(request.extravars))
    return str(path)


def event_handler(on_event: Callable[[Event], None]) -> Callable[[dict], bool]:
    """ansible-runner's event handler: each runner event as a typed event, to `on_event`."""
    def handle(raw: dict) -> bool:
        event = translate(raw)
        if event is not None:
            on_event(event)
        return True  # let runner keep its own event files for the record
    return handle


def run_playbook(request: PlaybookRun, on_event: Callable[[Event], None],
                 cancel: threading.Event | None = None) -> PlaybookResult:
    request.artifact_dir.mkdir(parents=True, exist_ok=True)
    runner = ansible_runner.run(
        private_data_dir=str(request.artifact_dir),
        artifact_dir=str(request.artifact_dir),
        ident=request.ident,
        playbook=str(request.playbook),
        inventory=str(request.inventory),
        extravars=_extravars_file(request),
        envvars={"PATH": _path_with_this_python(), processes.RUN_MARK: str(request.artifact_dir), **request.envvars},
        fact_cache=str(request.fact_cache) if request.fact_cache else None,
        forks=request.forks,
        limit=",".join(request.limit) or None,
        cmdline=request.cmdline,
        verbosity=request.verbosity,
        suppress_env_files=True,
        status_handler=_trim_environment,
        quiet=True,
        event_handler=event_handler(on_event),
        cancel_callback=(lambda: cancel.is_set()) if cancel is not None else None,
    )
    if runner.status in ("canceled", "timeout"):
        # ansible-runner killed ansible-playbook's process group; its workers, each in a
        # session of its own, and the commands they run are still going.
        processes.stop(processes.marked(request.artifact_dir))
    scrub_command_record(request.artifact_dir / request.ident / "command")
    return PlaybookResult(
        status=str(runner.status),
        rc=int(runner.rc if runner.rc is not None else 1),
        stdout_path=request.artifact_dir / request.ident / "stdout",
    )
