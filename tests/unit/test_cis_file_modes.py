"""The CIS file-permission items (playbooks/group_vars/all/cis_file_modes.yml): the judgement
the tightening module and the convergence probe share (module_utils gpuboot_file_modes), on
real files with real modes and owners; and which phases carry which lists. The lab's HA
cluster test checks the modes on real kubeadm nodes, after `up`, a repair and an upgrade."""
from __future__ import annotations

import importlib
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuboot.phases import catalog
from gpuboot.phases.convergence import state_phases
from tests.support.modules import load_module

ROOT = Path(__file__).resolve().parents[2]
phase_state = load_module("gpuboot_phase_state")
# load_module put the shared judgement where Ansible would: ansible.module_utils.<name>.
modes = importlib.import_module("ansible.module_utils.gpuboot_file_modes")


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def node(tmp_path):
    pki = tmp_path / "pki"
    pki.mkdir()
    files = {"pki/ca.crt": 0o644, "pki/ca.key": 0o600, "pki/front.crt": 0o400, "config.yaml": 0o664,
             "kubelet.service": 0o644}
    for name, mode in files.items():
        (tmp_path / name).write_text(name)
        os.chmod(tmp_path / name, mode)
    (tmp_path / "etcd").mkdir(mode=0o755)
    os.chmod(tmp_path / "etcd", 0o755)
    os.symlink(tmp_path / "config.yaml", tmp_path / "link.yaml")
    return tmp_path


def entries(root) -> list[dict]:
    return [{"path": f"{root}/pki/*.crt", "mode": "0600", "cis": "1.1.20"},
            {"path": f"{root}/pki/*.key", "mode": "0600", "cis": "1.1.21"},
            {"path": f"{root}/*.yaml", "mode": "0600", "cis": "4.1.9"},
            {"path": f"{root}/etcd", "mode": "0700", "cis": "1.1.11"},
            {"path": f"{root}/absent/*.conf", "mode": "0600", "cis": "4.1.1"}]


def test_looser_files_are_found_and_tightened_by_taking_bits_away(node):
    found = modes.loose(entries(node))
    assert {path for path, *_ in found} == {f"{node}/pki/ca.crt", f"{node}/config.yaml", f"{node}/etcd"}
    said = [modes.describe(*item) for item in found]
    assert f"{node}/pki/ca.crt is mode 0644, CIS 1.1.20 wants 0600 or stricter" in said
    assert f"{node}/etcd is mode 0755, CIS 1.1.11 wants 0700 or stricter" in said
    for item in found:
        modes.tighten(*item)
    assert (_mode(node / "pki/ca.crt"), _mode(node / "config.yaml"), _mode(node / "etcd")) == (0o600, 0o600, 0o700)
    # A stricter file stays stricter; a symlink is not followed into a chmod of its target's entry.
    assert _mode(node / "pki/front.crt") == 0o400
    assert modes.loose(entries(node)) == []


def test_a_file_not_owned_by_root_is_named_and_given_back_to_root(node):
    if os.geteuid() != 0:  # CI runs as root and must not skip it
        if os.environ.get("GPUBOOT_REQUIRE_LAB") == "1":
            pytest.fail("chown to another user needs root, and GPUBOOT_REQUIRE_LAB=1 requires this test")
        pytest.skip("chown to another user needs root")
    os.chown(node / "pki/ca.key", 1000, 1000)
    found = modes.loose(entries(node))
    key = next(item for item in found if item[0].endswith("ca.key"))
    assert modes.describe(*key) == f"{node}/pki/ca.key is owned by 1000:1000, CIS 1.1.21 wants root:root"
    modes.tighten(*key)
    info = os.stat(node / "pki/ca.key")
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o600)


def test_the_probe_names_a_loosened_file_as_the_reason_a_phase_runs_again(node, tmp_path_factory):
    directory = tmp_path_factory.mktemp("phases")
    phase = {"name": "workers_join", "fingerprint": "f", "files": [], "present": [], "services": [],
             "modes": entries(node)}
    record = phase_state._record_of(phase)
    (directory / "workers_join.json").write_text(json.dumps(record))
    reasons = phase_state._probe(None, str(directory), phase)
    assert f"{node}/config.yaml is mode 0664, CIS 4.1.9 wants 0600 or stricter" in reasons
    for item in modes.loose(entries(node)):
        modes.tighten(*item)
    assert phase_state._probe(None, str(directory), phase) == []


def _module(args: dict, *options: str) -> dict:
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json",
           "ANSIBLE_LIBRARY": str(ROOT / "playbooks" / "library"),
           "ANSIBLE_MODULE_UTILS": str(ROOT / "playbooks" / "module_utils"), "ANSIBLE_LOCALHOST_WARNING": "0"}
    # From a folder of its own: ansible.cfg in the working directory would put a fact cache in the checkout.
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-m",
                               "gpuboot_file_modes", "-a", json.dumps(args), *options],
                              capture_output=True, text=True, env={**env, "ANSIBLE_LOCAL_TEMP": scratch},
                              cwd=scratch, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_the_module_changes_nothing_in_check_mode_tightens_once_then_reports_no_change(node):
    args = {"entries": entries(node)}
    checked = _module(args, "--check")
    assert checked["changed"] and len(checked["tightened"]) == 3 and _mode(node / "pki/ca.crt") == 0o644
    first = _module(args)
    assert first["changed"] and first["tightened"] == checked["tightened"] and _mode(node / "pki/ca.crt") == 0o600
    again = _module(args)
    assert not again["changed"] and again["tightened"] == []


def test_the_kubeadm_phases_carry_the_lists_their_nodes_must_meet():
    lists = catalog.cis_file_modes()
    by_phase = {p.name: p.result_for(None).as_data()["modes"] for p in catalog.UP
                if not callable(p.result)}
    assert by_phase["workers_join"] == lists["node"]
    assert by_phase["control_plane_init"] == by_phase["control_plane_join"] == lists["node"] + lists["control_plane"]
    assert all(by_phase[name] == [] for name in ("os_prep", "container_runtime", "kube_packages", "ha_endpoint"))
    paths = {entry["path"] for entry in lists["node"] + lists["control_plane"]}
    # The items the benchmark names for kubeconfigs, PKI keys and certificates, kubelet's
    # config and unit, etcd's data.
    assert {"/etc/kubernetes/admin.conf", "/etc/kubernetes/kubelet.conf", "/etc/kubernetes/pki/*.key",
            "/etc/kubernetes/pki/etcd/*.key", "/etc/kubernetes/pki/*.crt", "/var/lib/kubelet/config.yaml",
            "/usr/lib/systemd/system/kubelet.service.d/*.conf", "/var/lib/etcd"} <= paths
    for entry in lists["node"] + lists["control_plane"]:
        assert entry["path"].startswith("/") and entry["cis"], entry
        assert int(entry["mode"], 8) & 0o077 in (0, 0o055), entry  # private, or a directory others may enter


def test_the_state_playbook_gets_the_modes_with_the_phase():
    phase = next(p for p in catalog.UP if p.name == "workers_join")
    [entry] = state_phases([(phase, "digest", ["w1"])], settings=None)
    assert entry["modes"] == catalog.cis_file_modes()["node"] and entry["present"] == ["/etc/kubernetes/kubelet.conf"]
