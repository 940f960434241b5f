"""The handoff's Git half against a real Git server (Debian's sshd and git on this machine,
gpuboot_lab.gitserver): the push module run by real Ansible with the deploy key and host-key
checking, and `gpuboot gitops diff` reading the same repository.

- the first push writes the cluster's directory; a second run changes nothing;
- a directory Git changed after the handoff is never written over, and `gitops diff` shows
  exactly what the inventory would change there;
- a wrong host key is refused (host-key checking stays on), and so is a key without access;
- the deploy key's text appears in no output."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.gitops.repo import Repository
from gpuboot.net import free_port
from gpuboot_lab.gitserver import GitServer

ROOT = Path(__file__).resolve().parents[2]
FOUR_TENANTS = ROOT / "tests" / "fixtures" / "four-tenants"


@pytest.fixture
def server(tmp_path):
    git = GitServer(tmp_path / "git", "127.0.0.1", free_port()).start()
    yield git
    git.stop()


@pytest.fixture
def inventory(tmp_path, server) -> Path:
    """The four-tenant inventory, pointed at the lab's Git server."""
    copy = tmp_path / "inventory"
    subprocess.run(["cp", "-r", str(FOUR_TENANTS), str(copy)], check=True)
    path = copy / "group_vars" / "all.yml"
    data = yaml.safe_load(path.read_text())
    data["gpuboot"]["gitops"] = {"repo_url": server.url, "path": "clusters/shared",
                                 "credentials_file": str(server.deploy_key), "known_hosts_file": str(server.known_hosts)}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return next(p for p in copy.iterdir() if p.suffix in (".yml", ".ini") and p.stem.startswith(("inventory", "hosts")))


def _push(inventory: Path, **override) -> dict:
    cluster = load_cluster(inventory)
    repository = Repository(cluster)
    gitops = cluster.settings.gitops
    args = {"repo_url": gitops.repo_url, "branch": gitops.branch, "directory": str(repository.root),
            "files": {str(p.relative_to(repository.root)): t for p, t in repository.render().items()},
            "key_file": gitops.credentials_file, "known_hosts_file": gitops.known_hosts_file, **override}
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json",
           "ANSIBLE_LIBRARY": str(ROOT / "playbooks" / "library"),
           "ANSIBLE_MODULE_UTILS": str(ROOT / "playbooks" / "module_utils"), "ANSIBLE_LOCALHOST_WARNING": "0",
           "ANSIBLE_CACHE_PLUGIN": "memory"}
    args_file = inventory.parent / "push-args.json"
    args_file.write_text(json.dumps(args))
    playbook = inventory.parent / "push.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "vars_files": [str(args_file)],
                                         "vars": {"ansible_python_interpreter": sys.executable},
                                         "tasks": [{"gpuboot_gitops_push": {k: "{{ " + k + " }}" for k in args}}]}]))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(playbook)], capture_output=True, text=True, env=env, timeout=180)
    result = json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    result["_output"] = done.stdout + done.stderr
    return result


def _key_lines(server: GitServer) -> list[str]:
    return [line for line in server.deploy_key.read_text().splitlines() if line and "PRIVATE KEY" not in line]


def test_the_handoff_pushes_once_and_never_over_what_git_changed(server, inventory, tmp_path, capsys):
    first = _push(inventory)
    assert first["changed"] and first["handoff"] == "pushed", first
    # What Git holds is the render, file for file.
    clone = tmp_path / "clone"
    assert server.git("clone", "--quiet", server.url, str(clone)).returncode == 0
    held = sorted(str(p.relative_to(clone / "clusters/shared")) for p in (clone / "clusters/shared").rglob("*")
                  if p.is_file())
    assert "tenants/llm-training/quota.yaml" in held and "argocd/root.yaml" in held
    assert held == sorted(first_files(inventory))

    again = _push(inventory)
    assert not again["changed"] and again["handoff"] == "unchanged" and again["commit"] == first["commit"]

    # A person changes a quota in Git: the handoff leaves it, `gitops diff` shows the change back.
    quota = clone / "clusters/shared/tenants/llm-training/quota.yaml"
    quota.write_text(quota.read_text().replace("requests.cpu:", "requests.cpu-edited-in-git:"))
    server.git("commit", "--quiet", "-am", "a person's change", cwd=clone)
    assert server.git("push", "--quiet", "origin", "HEAD:main", cwd=clone).returncode == 0
    third = _push(inventory)
    assert not third["changed"] and third["handoff"] == "differs"
    assert third["differs"] == ["tenants/llm-training/quota.yaml"]
    # The handoff then waits for the Applications Git declares (here the same as pushed).
    assert third["applications"] == first["applications"] and first["applications"][0] == "shared-root"
    capsys.readouterr()
    assert run(["gitops", "diff", str(inventory), "--exit-code"]) == 1
    shown = capsys.readouterr().out
    assert "a/clusters/shared/tenants/llm-training/quota.yaml" in shown
    assert "-    requests.cpu-edited-in-git:" in shown and "+    requests.cpu:" in shown
    assert "1 file(s) differ" in shown
    # The change was not undone in Git.
    server.git("pull", "--quiet", cwd=clone)
    assert "cpu-edited-in-git" in quota.read_text()

    for output in (first["_output"], again["_output"], third["_output"], shown):
        assert not any(line in output for line in _key_lines(server))


def first_files(inventory: Path) -> list[str]:
    repository = Repository(load_cluster(inventory))
    return [str(p.relative_to(repository.root)) for p in repository.render()]


def test_a_new_repository_gets_the_render_and_diff_says_nothing_differs(server, inventory, capsys):
    assert run(["gitops", "diff", str(inventory)]) == 0
    assert "no such branch yet" in capsys.readouterr().out
    assert _push(inventory)["handoff"] == "pushed"
    assert run(["gitops", "diff", str(inventory), "--exit-code"]) == 0
    assert "no difference" in capsys.readouterr().out


def test_a_wrong_host_key_or_a_key_without_access_is_refused(server, inventory, tmp_path):
    other = GitServer(tmp_path / "other", "127.0.0.1", free_port()).start()
    try:
        # The other server's host key under this server's address: ssh must refuse it.
        wrong = tmp_path / "wrong_known_hosts"
        wrong.write_text(other.known_hosts.read_text().replace(str(other.port), str(server.port)))
        refused = _push(inventory, known_hosts_file=str(wrong))
        assert refused.get("failed") and "Host key verification failed" in refused["msg"], refused
        assert "known_hosts_file" in refused["msg"]
        # The other server's deploy key has no access here.
        denied = _push(inventory, key_file=str(other.deploy_key))
        assert denied.get("failed") and "Permission denied" in denied["msg"], denied
        assert not any(line in refused["_output"] + denied["_output"] for line in _key_lines(server) + _key_lines(other))
    finally:
        other.stop()
