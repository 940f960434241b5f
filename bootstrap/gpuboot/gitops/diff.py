"""`gpuboot gitops diff`: what a render of the inventory now would change in the repository
Git holds. After the handoff gpuboot never pushes over Git: this is the change a person commits.
Git is read with the deploy key and the Git server's host key, as the handoff pushes."""
from __future__ import annotations

import difflib
import importlib.util
import shutil
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gpuboot import content
from gpuboot.config.checks import resolve_path
from gpuboot.config.model import Cluster
from gpuboot.errors import GitOpsError, UsageError
from gpuboot.gitops.repo import Repository


@cache
def _git():
    """The handoff's own Git helpers (playbooks/module_utils/gpuboot_git.py)."""
    path = content.content_dir() / "playbooks" / "module_utils" / "gpuboot_git.py"
    spec = importlib.util.spec_from_file_location("gpuboot_module_utils_git", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class RepositoryDiff:
    directory: str
    commit: str
    branch_exists: bool
    changed: list[str]
    text: str


def diff(cluster: Cluster) -> RepositoryDiff:
    gitops = cluster.settings.gitops
    if gitops is None:
        raise UsageError("gpuboot.gitops is not set: there is no repository to compare with",
                         hint="set gpuboot.gitops.repo_url (and credentials_file, known_hosts_file)")
    if not gitops.credentials_file or not gitops.known_hosts_file:
        raise UsageError("gpuboot.gitops.credentials_file and known_hosts_file are needed to read the repository",
                         hint="set the deploy key and the Git server's host key (ssh-keyscan -p PORT HOST)")
    git = _git()
    base = Path(cluster.inventory).parent
    env = git.git_env(str(resolve_path(gitops.credentials_file, base)), str(resolve_path(gitops.known_hosts_file, base)))
    repository = Repository(cluster)
    want = {str(path.relative_to(repository.root)): text for path, text in repository.render().items()}
    work = Path(tempfile.mkdtemp(prefix="gpuboot-gitops-diff-"))
    try:
        try:
            clone, exists = git.checkout(gitops.repo_url, gitops.branch, work, env)
        except git.GitError as error:
            raise GitOpsError(f"{error} (repository {gitops.repo_url}, branch {gitops.branch})",
                              hint="check the deploy key's access and that known_hosts_file holds the server's "
                                   "host key") from None
        have = git.read_tree(clone / repository.root)
        have.pop(".gpuboot-gitops.json", None)  # `gitops render`'s marker, not content
        commit = git.head(clone, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    changed = git.differing(have, want)
    directory = str(repository.root)
    lines: list[str] = []
    for path in changed:
        lines += difflib.unified_diff(have.get(path, "").splitlines(keepends=True),
                                      want.get(path, "").splitlines(keepends=True),
                                      fromfile=f"a/{directory}/{path}" if path in have else "/dev/null",
                                      tofile=f"b/{directory}/{path}" if path in want else "/dev/null")
    return RepositoryDiff(directory, commit, exists, changed, "".join(lines))
