"""Git over SSH with a deploy key and host-key checking on: what the GitOps handoff pushes with
(library/gpuboot_gitops_push.py) and what `gpuboot gitops diff` reads with, shared so that both
see the repository the same way."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path


class GitError(Exception):
    pass


def git_env(key_file: str, known_hosts_file: str, author: str = "gpuboot <gpuboot@localhost>") -> dict:
    name, _, email = author.partition(" <")
    email = email.rstrip(">") or "gpuboot@localhost"
    ssh = ["ssh", "-i", key_file, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
           "-o", f"UserKnownHostsFile={known_hosts_file}", "-o", "StrictHostKeyChecking=yes",
           "-o", "ConnectTimeout=20"]
    return {**os.environ, "GIT_SSH_COMMAND": " ".join(ssh), "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email,
            # The operator's own git configuration does not change what is read or pushed.
            "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def run_git(args: list[str], cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False,
                          timeout=300)
    if check and proc.returncode != 0:
        raise GitError(f"git {args[0]} failed: {(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc


def checkout(url: str, branch: str, work: Path, env: dict) -> tuple[Path, bool]:
    """The branch's tip in WORK/repo (a fresh repository when the branch does not exist yet),
    and whether the branch existed."""
    clone = work / "repo"
    heads = run_git(["ls-remote", "--heads", url, f"refs/heads/{branch}"], work, env).stdout.strip()
    if heads:
        run_git(["clone", "--quiet", "--depth", "1", "--single-branch", "--branch", branch, url, str(clone)], work, env)
    else:
        clone.mkdir()
        run_git(["init", "--quiet", "--initial-branch", branch], clone, env)
        run_git(["remote", "add", "origin", url], clone, env)
    return clone, bool(heads)


def read_tree(root: Path) -> dict[str, str]:
    """Every file under ROOT (relative path -> text); empty when ROOT does not exist."""
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in sorted(root.rglob("*")) if p.is_file()}


def differing(have: dict[str, str], want: dict[str, str]) -> list[str]:
    return sorted(path for path in set(have) | set(want) if have.get(path) != want.get(path))


def head(clone: Path, env: dict) -> str:
    proc = run_git(["rev-parse", "HEAD"], clone, env, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""
