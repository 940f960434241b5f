#!/usr/bin/python
"""Hand the rendered repository to Git, once: push the cluster's directory when the branch does
not have it yet, leave it alone when Git already holds the same files, and never write over a
directory that differs (after the handoff Git owns it; `gpuboot gitops diff` shows what a new
render would change). Runs on the control machine with the deploy key; host-key checking is on."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import yaml

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuboot_git import GitError, checkout, differing, git_env, head, read_tree, run_git

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


def applications(files: dict[str, str]) -> list[str]:
    """The Argo CD Applications the directory declares (the root first): what Argo CD will run
    from Git, whether gpuboot pushed it now or Git already held it."""
    names = []
    for path, text in sorted(files.items(), key=lambda item: (item[0] != "argocd/root.yaml", item[0])):
        if path.startswith("argocd/") and path.endswith(".yaml"):
            names += [doc["metadata"]["name"] for doc in yaml.safe_load_all(text)
                      if isinstance(doc, dict) and doc.get("kind") == "Application"]
    return names


def hand_over(params: dict, work: Path, check_mode: bool) -> dict:
    env = git_env(params["key_file"], params["known_hosts_file"], params["author"])
    url, branch = params["repo_url"], params["branch"]
    clone, _ = checkout(url, branch, work, env)
    directory = clone / params["directory"]
    have = read_tree(directory)
    want = params["files"]
    if have:
        changes = differing(have, want)
        if not changes:
            return {"changed": False, "handoff": "unchanged", "commit": head(clone, env),
                    "applications": applications(have)}
        # Git owns the directory now: its changes are people's, not gpuboot's to undo.
        return {"changed": False, "handoff": "differs", "differs": changes, "commit": head(clone, env),
                "applications": applications(have)}
    if check_mode:
        return {"changed": True, "handoff": "would push", "files": len(want), "applications": applications(want)}
    for relative, text in want.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    run_git(["add", "--all", "--", params["directory"]], clone, env)
    run_git(["commit", "--quiet", "-m", f"gpuboot: hand {params['directory']} over to GitOps"], clone, env)
    run_git(["push", "--quiet", "origin", f"HEAD:refs/heads/{branch}"], clone, env)
    return {"changed": True, "handoff": "pushed", "files": len(want), "commit": head(clone, env),
            "applications": applications(want)}


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
