"""Node-local phases on execution nodes, through ansible-runner's streaming interface.

The control machine stages what one share of the hosts needs (the playbooks and roles, the
inventory with its group_vars/ and host_vars/, the extra variables, the files the settings
name), streams it to `ansible-runner worker` on an executor (`transmit`), and turns what comes
back into the same events as a local run (`process`), so progress and the run log stay one
stream. The transport is any command whose stdin and stdout carry the stream: `ssh` to the
executor in the product (the mechanism AWX's Receptor mesh carries instead of ssh)."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ansible_runner

from gpuboot import content
from gpuboot.ansible.runner import PlaybookResult, PlaybookRun, event_handler, scrub_command_record
from gpuboot.config.checks import resolve_path
from gpuboot.config.model import Executor, Ssh
from gpuboot.events import Event, HostCounts, HostResult, PlaybookStats
from gpuboot.files import write_private

# What a share needs of the product: paths relative to the content directory.
PROJECT = ("ansible.cfg", "playbooks", "roles", "mirror/releases")
# Environment that names places on the control machine; the worker has its own.
CONTROL_ONLY_ENV = ("PATH", "VIRTUAL_ENV", "PYTHONPATH")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# As for the nodes (ansible.cfg): an executor that does not answer fails its share in 20 s,
# and one that goes silent mid-stream in about a minute, not when TCP gives up.
LIVENESS = ("-o", "ConnectTimeout=20", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4")


@dataclass(frozen=True)
class Transport:
    """How to reach `ansible-runner worker` on one executor for one share."""

    executor: str
    argv: tuple[str, ...]
    # The worker's private data directory: absolute, on the executor.
    worker_dir: str
    # Where the worker's ansible-playbook is: beside its ansible-runner when that is a path.
    bin_dir: str | None = None
    # The worker's ssh masters to the nodes: per run, shared by its shares (as on the control
    # machine), short for the socket's path.
    control_path_dir: str = ""


def ssh_transport(executor: Executor, ssh: Ssh, run_id: str, ident: str, inventory_dir: Path) -> Transport:
    """ssh to the executor (its own user, port and key, else gpuboot.ssh's; relative files are
    the inventory folder's), host-key checking as for the nodes; the worker unpacks into a
    directory of the share's own and deletes it."""
    work = executor.work_dir.rstrip("/")
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={'yes' if ssh.host_key_checking else 'no'}",
            *LIVENESS, "-p", str(executor.port or ssh.port)]

    def local(value: str) -> str:
        return str(resolve_path(value, inventory_dir))

    key = executor.private_key_file or ssh.private_key_file
    if key:
        argv += ["-i", local(key)]
    if executor.known_hosts_file:
        argv += ["-o", f"UserKnownHostsFile={local(executor.known_hosts_file)}"]
    worker_dir = f"{work}/{run_id}-{ident}"
    remote = shlex.join([executor.runner, "worker", "--private-data-dir", worker_dir, "--delete"])
    argv += [f"{executor.user or ssh.user}@{executor.address}", "--", remote]
    bin_dir = str(Path(executor.runner).parent) if "/" in executor.runner else None
    return Transport(executor.name, tuple(argv), worker_dir, bin_dir, f"{work}/cp/{run_id}")


def shares(hosts: list[str], executors: list[Executor]) -> list[tuple[Executor, list[str]]]:
    """The hosts in inventory order, cut into one contiguous share per executor (sizes differ
    by at most one); an executor without hosts gets no share."""
    count = len(executors)
    cut = [len(hosts) * i // count for i in range(count + 1)]
    return [(executors[i], hosts[cut[i]:cut[i + 1]]) for i in range(count) if cut[i + 1] > cut[i]]


def _files_in(settings: Any) -> Iterator[tuple[dict, str, str]]:
    """(holder, key, path) of every `*_file` setting: a file on the control machine."""
    if isinstance(settings, dict):
        for key, value in settings.items():
            if isinstance(value, str) and key.endswith("_file"):
                yield settings, key, value
            else:
                yield from _files_in(value)
    elif isinstance(settings, list):
        for item in settings:
            yield from _files_in(item)


def stage(request: PlaybookRun, transport: Transport, into: Path) -> dict:
    """Write the share's private data directory and return ansible-runner's arguments for it.
    Paths that name the control machine become the worker's: the settings' files are copied
    in, 0600, and the extra variables (which name them) point at the copies."""
    root = content.content_dir()
    project = into / "project"
    for part in PROJECT:
        source, target = root / part, project / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("molecule", "__pycache__", "*.pyc"))
        elif source.is_file():
            shutil.copy2(source, target)
    inventory = _stage_inventory(request.inventory, into / "inventory")
    worker = transport.worker_dir

    extravars = json.loads(json.dumps(request.extravars))
    for index, (holder, key, path) in enumerate(_files_in(extravars.get("gpuboot_settings"))):
        source = resolve_path(path, request.inventory_dir)
        if source.is_file():
            name = f"{index}-{source.name}"
            write_private(into / "files" / name, source.read_text())
            holder[key] = f"{worker}/files/{name}"
    # ansible-runner passes env/extravars as `-e @file`; only this share's hosts run.
    write_private(into / "env" / "extravars", json.dumps(extravars))

    env = {k: v for k, v in request.envvars.items() if k not in CONTROL_ONLY_ENV}
    env.update({"ANSIBLE_CONFIG": f"{worker}/project/ansible.cfg", "ANSIBLE_ROLES_PATH": f"{worker}/project/roles",
                "ANSIBLE_SSH_CONTROL_PATH_DIR": transport.control_path_dir or f"{worker}/cp"})
    if transport.bin_dir:
        env["PATH"] = f"{transport.bin_dir}:{SYSTEM_PATH}"
    key = env.get("ANSIBLE_PRIVATE_KEY_FILE")
    if key and Path(key).is_file():
        write_private(into / "files" / "ssh-key", Path(key).read_text())
        env["ANSIBLE_PRIVATE_KEY_FILE"] = f"{worker}/files/ssh-key"
    # Absolute here: ansible-runner's transmit makes both relative to the private data directory
    # (a relative inventory it would take for inventory text).
    return {"playbook": str(project / "playbooks" / request.playbook.name), "inventory": str(into / "inventory" / inventory),
            "envvars": env, "forks": request.forks, "limit": ",".join(request.limit) or None,
            "cmdline": request.cmdline, "verbosity": request.verbosity, "suppress_env_files": True,
            "ident": request.ident}


def _stage_inventory(inventory: Path, into: Path) -> str:
    """The inventory as Ansible reads it: a directory whole, or the file with the group_vars/
    and host_vars/ beside it. Returns its name inside `into`."""
    if inventory.is_dir():
        shutil.copytree(inventory, into / inventory.name)
        return inventory.name
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy2(inventory, into / inventory.name)
    for beside in ("group_vars", "host_vars"):
        if (inventory.parent / beside).is_dir():
            shutil.copytree(inventory.parent / beside, into / beside)
    return inventory.name


def run_streamed(request: PlaybookRun, transport: Transport, on_event: Callable[[Event], None],
                 cancel: threading.Event | None = None) -> PlaybookResult:
    """One share on one executor: transmit, the worker over the transport, process back into
    events. An executor that cannot be reached or breaks off fails each of the share's hosts
    with its reason."""
    request.artifact_dir.mkdir(parents=True, exist_ok=True)
    staged = request.artifact_dir / f"{request.ident}.stage"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(mode=0o700)
    kwargs = stage(request, transport, staged)
    proc = subprocess.Popen(transport.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    said: list[bytes] = []
    threading.Thread(target=lambda: said.append(proc.stderr.read()), daemon=True).start()

    def send() -> None:
        try:
            ansible_runner.run(streamer="transmit", _output=proc.stdin, private_data_dir=str(staged), **kwargs)
        except (BrokenPipeError, OSError):
            pass  # the worker went away: process() reports it
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    sender = threading.Thread(target=send, name=f"transmit-{transport.executor}", daemon=True)
    sender.start()
    if cancel is not None:
        def stop_when_cancelled() -> None:
            while proc.poll() is None:
                if cancel.wait(0.5):
                    proc.terminate()  # ssh goes, and with it the worker's stdin
                    return
        threading.Thread(target=stop_when_cancelled, daemon=True).start()

    final: dict = {}

    def status(data: dict, runner_config: object = None) -> None:
        final.update(data)

    local = request.artifact_dir / f"{request.ident}.process"
    local.mkdir(mode=0o700, exist_ok=True)
    processor = ansible_runner.run(streamer="process", _input=proc.stdout, private_data_dir=str(local),
                                   artifact_dir=str(request.artifact_dir / request.ident), quiet=True,
                                   event_handler=event_handler(on_event), status_handler=status)
    sender.join()
    code = proc.wait()
    shutil.rmtree(staged, ignore_errors=True)
    shutil.rmtree(local, ignore_errors=True)
    scrub_command_record(request.artifact_dir / request.ident / "command")
    outcome = str(final.get("status") or processor.status)
    if outcome in ("successful", "failed"):
        # The worker's exit status is ansible-playbook's (ssh passes the remote command's on).
        rc = 0 if outcome == "successful" else (code or 2)
        return PlaybookResult(status=outcome, rc=rc, stdout_path=request.artifact_dir / request.ident / "stdout")
    why = final.get("job_explanation") or f"the worker stream ended (ssh exit {code})"
    ssh_said = b"".join(said).decode(errors="replace").strip().splitlines()[-3:]
    message = f"executor {transport.executor}: {why}" + (f"; ssh: {' / '.join(ssh_said)}" if ssh_said else "")
    for host in request.limit:
        on_event(HostResult(host=host, task="run on its executor", status="failed", message=message))
    on_event(PlaybookStats(hosts={host: HostCounts(failed=1) for host in request.limit}))
    return PlaybookResult(status="failed", rc=max(code, 1), stdout_path=request.artifact_dir / request.ident / "stdout")


@dataclass(frozen=True)
class SplitRunner:
    """A Runner (gpuboot.phases.engine) for one phase whose hosts are split among executors:
    every share runs at once, PlaybookStats are merged into one, the result is ok only when
    every share's is."""

    executors: list[Executor]
    ssh: Ssh
    transport: Callable[[Executor, Ssh, str, str, Path], Transport] = ssh_transport

    def __call__(self, request: PlaybookRun, on_event: Callable[[Event], None],
                 cancel: threading.Event | None = None) -> PlaybookResult:
        hosts = list(request.limit)
        stats: dict[str, HostCounts] = {}
        lock = threading.Lock()
        results: list[PlaybookResult] = []

        def share_events(event: Event) -> None:
            if isinstance(event, PlaybookStats):
                with lock:
                    stats.update(event.hosts)
                return
            on_event(event)

        def run(executor: Executor, share: list[str]) -> None:
            ident = f"{request.ident}-{executor.name}"
            run_id = str(request.extravars.get("gpuboot_run_id", "run"))
            transport = self.transport(executor, self.ssh, run_id, ident, request.inventory_dir)
            result = run_streamed(replace(request, ident=ident, limit=tuple(share)), transport, share_events, cancel)
            with lock:
                results.append(result)

        threads = [threading.Thread(target=run, args=(executor, share), name=f"share-{executor.name}", daemon=True)
                   for executor, share in shares(hosts, self.executors)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        on_event(PlaybookStats(hosts=dict(sorted(stats.items()))))
        failed = [r for r in results if not r.ok]
        first = failed[0] if failed else results[0]
        return PlaybookResult(status="failed" if failed else "successful", rc=max(r.rc for r in results),
                              stdout_path=first.stdout_path)
