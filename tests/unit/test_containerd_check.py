"""container_runtime's check of the running containerd (roles/container_runtime/tasks/check.yml):
its one `fail` task, run by ansible-playbook on this machine against `containerd config dump`
texts, passes both TOML quote styles and names every setting a drop-in undid."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "roles" / "container_runtime" / "tasks" / "check.yml"
INPUTS = {"container_runtime_systemd_cgroup": True, "container_runtime_certs_dir": "/etc/containerd/certs.d",
          "container_runtime_sandbox_image": "mirror.lab:5000/pause:3.10.1", "container_runtime_config_version": 3,
          "container_runtime_cdi_spec_dir": "/var/run/cdi", "container_runtime_nri_required": True,
          "container_runtime_nri_socket": "/var/run/nri/nri.sock", "container_runtime_dropin_dir": "/etc/containerd/conf.d"}
# The parts of a containerd 2 dump the check reads (single-quoted strings, as 2.x prints them).
KEPT = """version = 3
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = 'mirror.lab:5000/pause:3.10.1'
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = '/etc/containerd/certs.d'
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = '/var/run/nri/nri.sock'
"""


def check(tmp_path: Path, dump: str | None, *options: str, **inputs) -> tuple[bool, str]:
    """Run the check's fail task on localhost; (passed, the failure's message). A dump of None
    is the read a dry run skipped."""
    task = next(t for t in yaml.safe_load(CHECK.read_text()) if "ansible.builtin.fail" in t)
    read = {"skipped": True, "changed": False} if dump is None else {"stdout": dump}
    play = [{"hosts": "localhost", "gather_facts": False,
             "vars": {**INPUTS, **inputs, "container_runtime_dump": read}, "tasks": [task]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    exe = Path(sys.executable).parent / "ansible-playbook"
    proc = subprocess.run([str(exe), "-i", "localhost,", "-c", "local", *options, str(tmp_path / "play.yml")],
                          env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode in (0, 2), proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return not result.get("failed", False), result.get("msg", "")


@pytest.mark.parametrize("dump", [KEPT, KEPT.replace("'", '"')], ids=["containerd-2", "containerd-1-quotes"])
def test_kept_configuration_passes(tmp_path, dump):
    assert check(tmp_path, dump) == (True, "")


LOSSES = {
    "cgroup": (KEPT.replace("SystemdCgroup = true", "SystemdCgroup = false"), "SystemdCgroup is not true"),
    "config_path": (KEPT.replace("config_path = '/etc/containerd/certs.d'", "config_path = ''"),
                    "config_path is not /etc/containerd/certs.d"),
    "sandbox": (KEPT.replace("mirror.lab:5000/pause", "registry.k8s.io/pause"),
                "the sandbox image is not mirror.lab:5000/pause:3.10.1"),
    "cri": (KEPT + "disabled_plugins = ['io.containerd.grpc.v1.cri']\n", "the CRI plugin is disabled"),
    "cdi": (KEPT.replace("['/etc/cdi', '/var/run/cdi']", "['/etc/cdi']"), "CDI's spec directories leave out /var/run/cdi"),
    "nri-off": (KEPT.replace("disable = false", "disable = true"), "NRI is off or listens elsewhere"),
    "nri-socket": (KEPT.replace("/var/run/nri/nri.sock", "/run/other.sock"), "NRI is off or listens elsewhere"),
}


@pytest.mark.parametrize("case", LOSSES, ids=list(LOSSES))
def test_each_lost_setting_is_named(tmp_path, case):
    dump, named = LOSSES[case]
    passed, message = check(tmp_path, dump)
    assert not passed
    assert named in message and "/etc/containerd/conf.d" in message
    # Only what was lost is named.
    assert not [other for other, (_, words) in LOSSES.items() if words != named and words in message], message


def test_every_loss_is_named_at_once(tmp_path):
    dump = KEPT.replace("SystemdCgroup = true", "SystemdCgroup = false").replace("disable = false", "disable = true")
    passed, message = check(tmp_path, dump)
    assert not passed and "SystemdCgroup is not true" in message and "NRI is off" in message


def test_checks_that_do_not_apply_are_left_out(tmp_path):
    """No NRI where the toolkit is no NRI plugin; no CDI check before containerd 2's config version 3."""
    dump = KEPT.replace("disable = false", "disable = true").replace("['/etc/cdi', '/var/run/cdi']", "['/etc/cdi']")
    assert check(tmp_path, dump, container_runtime_nri_required=False, container_runtime_config_version=2) == (True, "")


def test_a_dry_run_skips_it(tmp_path):
    """`plan --check` reads no dump (the read is skipped): the check is skipped, not failed."""
    assert check(tmp_path, None, "--check") == (True, "")
