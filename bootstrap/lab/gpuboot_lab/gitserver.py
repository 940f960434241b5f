"""A real Git server for the lab, on its network's gateway: Debian's OpenSSH server (a private
instance on its own port, its own host key) in front of Debian's git, one bare repository, and a
deploy key that may only run git-shell there. What a data centre's Git service is to gpuboot:
an SSH URL, a host key to check and a key that can push."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpuboot_lab.errors import LabError
from gpuboot_lab.process import listeners_on, stop_own_process

SSHD = "/usr/sbin/sshd"
# Its configuration file's name marks the lab's own sshd (what `lab down` may stop).
CONFIG_NAME = "gpuboot-lab-git-sshd_config"
PROGRAM = CONFIG_NAME.encode()


@dataclass
class GitServer:
    directory: Path
    address: str
    port: int
    repository: str = "fleet.git"
    pid: int | None = None

    @property
    def repo_path(self) -> Path:
        return self.directory / "repos" / self.repository

    @property
    def url(self) -> str:
        return f"ssh://root@{self.address}:{self.port}{self.repo_path}"

    @property
    def deploy_key(self) -> Path:
        return self.directory / "deploy-key"

    @property
    def known_hosts(self) -> Path:
        return self.directory / "known_hosts"

    def start(self) -> GitServer:
        for tool in (SSHD, "ssh-keygen", "git", "git-shell"):
            if shutil.which(tool) is None:
                raise LabError(f"{tool} is not installed", hint="apt-get install openssh-server git")
        self.directory.mkdir(parents=True, exist_ok=True)
        host_key = self.directory / "host-key"
        for key in (host_key, self.deploy_key):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key.name, "-f", str(key)],
                               check=True)
            key.chmod(0o600)
        public_host_key = (self.directory / "host-key.pub").read_text().split()[:2]
        self.known_hosts.write_text(f"[{self.address}]:{self.port} {' '.join(public_host_key)}\n")
        # The deploy key runs git-shell only: push and fetch, nothing else.
        restrictions = 'command="git-shell -c \\"$SSH_ORIGINAL_COMMAND\\"",no-port-forwarding,no-pty,no-agent-forwarding'
        authorized = self.directory / "authorized_keys"
        authorized.write_text(f"{restrictions} {(self.directory / 'deploy-key.pub').read_text().strip()}\n")
        authorized.chmod(0o600)
        if not self.repo_path.exists():
            subprocess.run(["git", "init", "--quiet", "--bare", "--initial-branch", "main", str(self.repo_path)],
                           check=True)
        # A Git server a killed run left on this address is stopped; anything else there is not ours.
        for pid in listeners_on(self.address):
            if f"{self.address}:{self.port}" in _listening_ports(pid) and not stop_own_process(pid, PROGRAM, group=True):
                raise LabError(f"{self.address}:{self.port} is taken by pid {pid}", hint="stop it or pick another port")
        config = self.directory / CONFIG_NAME
        config.write_text("\n".join([
            f"ListenAddress {self.address}:{self.port}", f"HostKey {host_key}",
            f"AuthorizedKeysFile {authorized}", f"PidFile {self.directory / 'sshd.pid'}",
            "PermitRootLogin forced-commands-only", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "AllowUsers root",
            "LogLevel VERBOSE", ""]))
        Path("/run/sshd").mkdir(exist_ok=True)
        log = self.directory / "sshd.log"
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log.open("a"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.pid = proc.pid
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LabError(f"the lab's Git server stopped: {log.read_text()[-500:]}")
            probe = subprocess.run(["ssh-keyscan", "-T", "2", "-p", str(self.port), self.address],
                                   capture_output=True, text=True)
            if "ssh-ed25519" in probe.stdout:
                return self
            time.sleep(0.3)
        self.stop()
        raise LabError(f"the lab's Git server did not answer on {self.address}:{self.port}")

    def git(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """git with the deploy key, checking the server's host key."""
        ssh = (f"ssh -i {self.deploy_key} -o IdentitiesOnly=yes -o BatchMode=yes "
               f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes")
        env = dict(os.environ, GIT_SSH_COMMAND=ssh, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1",
                   GIT_AUTHOR_NAME="lab", GIT_AUTHOR_EMAIL="lab@lab", GIT_COMMITTER_NAME="lab",
                   GIT_COMMITTER_EMAIL="lab@lab")
        return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)

    def stop(self) -> None:
        if self.pid:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self.pid = None


def _listening_ports(pid: int) -> str:
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=False).stdout
    return " ".join(line.split()[3] for line in out.splitlines() if f"pid={pid}," in line)
