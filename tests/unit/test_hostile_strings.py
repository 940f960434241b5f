"""Hostile strings at the edges: every free-form string of the inventory that reaches a
config file (keepalived.conf, kubeadm's YAML), a manifest or a command line has a form, and
a value with a newline, a quote, a brace, a template or a shell character is refused at
validation, located, with the form in words: nothing reaches a host or a template."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuboot.config.loader import load_cluster
from gpuboot.errors import InventoryError

BASE = Path(__file__).resolve().parents[1] / "corpus" / "forms" / "yaml" / "inventory.yml"
TEMPLATE = "{{ lookup('pipe', 'id') }}"

# (where in gpuboot, the value, the path the problem must name)
CASES = [
    (("control_plane", "interface"), "bond0\n    track_script { pwn }", "gpuboot.control_plane.interface"),
    (("control_plane", "dns_name"), TEMPLATE, "gpuboot.control_plane.dns_name"),
    (("control_plane", "dns_name"), "api.example.com; id", "gpuboot.control_plane.dns_name"),
    (("networking", "dns_domain"), "cluster.local\nkind: Secret", "gpuboot.networking.dns_domain"),
    (("ssh", "user"), "ops -oProxyCommand=id", "gpuboot.ssh.user"),
    (("ssh", "jump_host"), "bastion -oProxyCommand=sh", "gpuboot.ssh.jump_host"),
    (("ssh", "private_key_file"), "keys/id\nProxyCommand sh", "gpuboot.ssh.private_key_file"),
    (("mirror", "packages_url"), "https://m.example/p' ; curl evil", "gpuboot.mirror.packages_url"),
    (("tools", "helm"), "helm; id", "gpuboot.tools.helm"),
    (("node_os", "kernels"), ["5.15.0-1048 $(id)"], "gpuboot.node_os.kernels[0]"),
    (("gitops", "repo_url"), "https://git.example/x --upload-pack=touch", "gpuboot.gitops.repo_url"),
    (("gitops", "branch"), "main\n--force", "gpuboot.gitops.branch"),
    (("gitops", "path"), "../../etc", "gpuboot.gitops.path"),
    (("tenants", 0, "groups"), ['team"}], "kind": "ClusterRoleBinding'], "gpuboot.tenants[0].groups[0]"),
    (("release",), "k8s-1.36\nextra: 1", "gpuboot.release"),
    (("ignored_hosts",), ["storage; id"], "gpuboot.ignored_hosts[0]"),
]


def _with(tmp_path: Path, keys: tuple, value) -> Path:
    data = yaml.safe_load(BASE.read_text())
    settings = data["all"]["vars"]["gpuboot"]
    settings.setdefault("node_os", {"id": "ubuntu-22.04"})
    settings.setdefault("gitops", {"repo_url": "https://git.example/platform.git"})
    target = settings
    for key in keys[:-1]:
        target = target.setdefault(key, {}) if isinstance(key, str) else target[key]
    target[keys[-1]] = value
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_base_with_every_section_is_valid(tmp_path):
    assert load_cluster(_with(tmp_path, ("gitops", "branch"), "release/2026.11")).settings.gitops.branch == "release/2026.11"


@pytest.mark.parametrize(("keys", "value", "field"), CASES, ids=[c[2] for c in CASES])
def test_a_hostile_string_is_refused_where_it_is_written(tmp_path, keys, value, field):
    path = _with(tmp_path, keys, value)
    with pytest.raises(InventoryError) as caught:
        load_cluster(path)
    located = [p for p in caught.value.problems if p.path == field]
    assert located, [str(p) for p in caught.value.problems]
    problem = located[0]
    assert problem.file == str(path) and problem.line, problem
    assert "wrong form" in problem.message and problem.fix.startswith("write "), problem


def test_a_hostile_kernel_on_a_node_is_refused_too(tmp_path):
    data = yaml.safe_load(BASE.read_text())
    gpu01 = data["all"]["children"]["workers"]["children"]["gpu_workers"]["hosts"]["gpu01"]
    gpu01["gpuboot_node"]["kernel"] = TEMPLATE
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(InventoryError) as caught:
        load_cluster(path)
    assert [p.path for p in caught.value.problems] == ["gpu01.gpuboot_node.kernel"]
