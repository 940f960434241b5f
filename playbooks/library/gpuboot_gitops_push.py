#!/usr/bin/python
"""Hand the rendered repository to Git, once: push the cluster's directory when the branch does
not have it yet, leave it alone when Git already holds the same files, and never write over a
directory that differs (after the handoff Git owns it; `gpuboot gitops diff` shows what a new
render would change). Runs on the control machine with the deploy key; host-key checking is on."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpuboot_gitops_push
short_description: Push gpuboot's rendered GitOps repository once, never over Git's own changes
options:
  repo_url: {type: str, required: true, description: The repository (ssh:// or user@host:path).}
  branch: {type: str, required: true, description: The branch Argo CD follows.}
  directory: {type: str, required: true, description: The cluster's directory in the repository.}
  files: {type: dict, required: true, description: Path in the directory -> text.}
  key_file: {type: path, required: true, description: The deploy key (SSH private key).}
  known_hosts_file: {type: path, required: true, description: The Git server's host key.}
  author: {type: str, default: gpuboot <gpuboot@localhost>, description: Author of the commit.}
"""


class GitError(Exception):
    pass


def run_git(args: list[str], cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False,
                          timeout=300)
    if check and proc.returncode != 0:
        raise GitError(f"git {args[0]} failed: {(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc


def git_env(key_file: str, known_hosts_file: str, author: str) -> dict:
    name, _, email = author.partition(" <")
    ssh = ["ssh", "-i", key_file, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
           "-o", f"UserKnownHostsFile={known_hosts_file}", "-o", "StrictHostKeyChecking=yes",
           "-o", "ConnectTimeout=20"]
    return {**os.environ, "GIT_SSH_COMMAND": " ".join(ssh), "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email.rstrip(">") or "gpuboot@localhost",
            "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email.rstrip(">") or "gpuboot@localhost",
            # The operator's own git configuration does not change what is pushed.
            "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def current_files(root: Path) -> dict[str, str] | None:
    if not root.is_dir():
        return None
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in sorted(root.rglob("*")) if p.is_file()}


def differing(have: dict[str, str], want: dict[str, str]) -> list[str]:
    return sorted(path for path in set(have) | set(want) if have.get(path) != want.get(path))


def hand_over(params: dict, work: Path, check_mode: bool) -> dict:
    env = git_env(params["key_file"], params["known_hosts_file"], params["author"])
    url, branch = params["repo_url"], params["branch"]
    heads = run_git(["ls-remote", "--heads", url, f"refs/heads/{branch}"], work, env).stdout.strip()
    clone = work / "repo"
    if heads:
        run_git(["clone", "--quiet", "--depth", "1", "--single-branch", "--branch", branch, url, str(clone)], work, env)
    else:
        clone.mkdir()
        run_git(["init", "--quiet", "--initial-branch", branch], clone, env)
        run_git(["remote", "add", "origin", url], clone, env)
    directory = clone / params["directory"]
    have = current_files(directory)
    want = params["files"]
    if have is not None and have:
        changes = differing(have, want)
        if not changes:
            return {"changed": False, "action": "unchanged", "commit": _head(clone, env)}
        # Git owns the directory now: its changes are people's, not gpuboot's to undo.
        return {"changed": False, "action": "differs", "differs": changes, "commit": _head(clone, env)}
    if check_mode:
        return {"changed": True, "action": "would push", "files": len(want)}
    for relative, text in want.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    run_git(["add", "--all", "--", params["directory"]], clone, env)
    run_git(["commit", "--quiet", "-m", f"gpuboot: hand {params['directory']} over to GitOps"], clone, env)
    run_git(["push", "--quiet", "origin", f"HEAD:refs/heads/{branch}"], clone, env)
    return {"changed": True, "action": "pushed", "files": len(want), "commit": _head(clone, env)}


def _head(clone: Path, env: dict) -> str:
    proc = run_git(["rev-parse", "HEAD"], clone, env, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def main() -> None:
    module = AnsibleModule(argument_spec={
        "repo_url": {"type": "str", "required": True},
        "branch": {"type": "str", "required": True},
        "directory": {"type": "str", "required": True},
        "files": {"type": "dict", "required": True},
        "key_file": {"type": "path", "required": True},
        "known_hosts_file": {"type": "path", "required": True},
        "author": {"type": "str", "default": "gpuboot <gpuboot@localhost>"},
    }, supports_check_mode=True)
    if shutil.which("git") is None:
        module.fail_json(msg="git is not installed on the control machine: install it (apt install git) and re-run")
    work = Path(tempfile.mkdtemp(prefix="gpuboot-gitops-"))
    try:
        result = hand_over(module.params, work, module.check_mode)
    except GitError as error:
        module.fail_json(msg=f"{error} (repository {module.params['repo_url']}, branch {module.params['branch']}): "
                             "check that the deploy key has write access and that known_hosts_file holds the "
                             "server's host key")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
