"""A package manager that hangs (the lab saw apt's acquire wait on a method with nothing to
read, on one loaded node of six, until the task's limit held the run for 15 minutes and left
apt holding its lock for the next run; later, under load, Ansible's async wrapper missed the
methods it had started before grouping them): each try of a package task runs in a session of
its own, is stopped after its own time with every process it started, and is tried again.

Real apt on a lab node over real SSH, run by the real ansible-playbook with the package_source
role; the hang comes from a double of an apt method (tests/doubles/apt_method/hang) that
never answers on its first use, or on every use."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuboot_lab.cluster import Lab, LabSpec
from tests.integration.conftest import ssh

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
HANG_METHOD = (ROOT / "tests" / "doubles" / "apt_method" / "hang").read_bytes()
SOURCE = "deb [trusted=yes] hang:/srv/gpuboot-probe ./"
TRY_S = 20  # a try of a loaded machine (two lanes of labs) reads this one-package source in a few seconds

# One package in a flat repository on the node, served through the hanging method.
PROBE_REPO = """set -e
rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources
mkdir -p /tmp/probe/DEBIAN /srv/gpuboot-probe
printf 'Package: gpuboot-probe\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: lab <lab@lab>\\nDescription: probe\\n' \\
  > /tmp/probe/DEBIAN/control
dpkg-deb -b /tmp/probe /srv/gpuboot-probe/gpuboot-probe_1.0_all.deb >/dev/null
cd /srv/gpuboot-probe
{ dpkg-deb -f gpuboot-probe_1.0_all.deb; echo "Filename: ./gpuboot-probe_1.0_all.deb"
  echo "Size: $(stat -c %s gpuboot-probe_1.0_all.deb)"
  echo "SHA256: $(sha256sum gpuboot-probe_1.0_all.deb | cut -d' ' -f1)"; echo; } > Packages
"""


@pytest.fixture(scope="module")
def node(lab_required, tmp_path_factory):
    base = tmp_path_factory.mktemp("hang")
    lab = Lab(base / "_lab", log=lambda m: None)
    lab.down("apthang")
    state = lab.up(LabSpec(name="apthang", control_planes=1, workers=0, gpu_workers=0, subnet="10.213.93.0/24"),
                   base / "inventory.yml")
    info = {"lab": lab, "state": state}
    host = next(iter(state.addresses))
    try:
        put = ssh(info, host, "cat > /usr/lib/apt/methods/hang && chmod 0755 /usr/lib/apt/methods/hang",
                  stdin=HANG_METHOD)
        assert put.returncode == 0, put.stderr
        made = ssh(info, host, PROBE_REPO)
        assert made.returncode == 0, made.stderr
        yield {"info": info, "host": host, "dir": base}
    finally:
        lab.down("apthang")


def fresh(node, hang_always: bool) -> None:
    """The node as before a first run: no source of ours, the method unspent."""
    done = ssh(node["info"], node["host"],
               "rm -f /etc/apt/sources.list.d/gpuboot-mirror.list /run/gpuboot-hang-spent; "
               + ("touch /etc/gpuboot-hang-always" if hang_always else "rm -f /etc/gpuboot-hang-always"))
    assert done.returncode == 0, done.stderr


def package_source(node, tries: int) -> subprocess.CompletedProcess[str]:
    lab, state = node["info"]["lab"], node["info"]["state"]
    inventory = node["dir"] / "hosts.ini"
    inventory.write_text(
        f"{node['host']} ansible_host={state.addresses[node['host']]} ansible_user=root "
        f"ansible_ssh_private_key_file={lab.dir / 'id_ed25519'} "
        f"ansible_ssh_common_args='-o UserKnownHostsFile={lab.dir / 'known_hosts'}'\n")
    playbook = node["dir"] / "source.yml"
    playbook.write_text(yaml.safe_dump([{"name": "source", "hosts": "all", "gather_facts": True,
                                         "roles": [{"role": "package_source"}]}]))
    extra = {"package_source_apt_repository": SOURCE, "package_source_apt_key_file": "",
             "package_source_apt_ca_file": "", "package_source_rpm_baseurl": "", "package_source_rpm_key_file": "",
             "package_source_update_try_timeout": TRY_S, "package_source_update_tries": tries}
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_CACHE_PLUGIN="memory")
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-v", "-i", str(inventory),
                           "-e", json.dumps(extra), str(playbook)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def left_behind(node) -> str:
    """What a stopped try could leave on the node: its processes, and apt's lock held. The task
    ends only after its tries' sessions are gone, so this looks a few seconds at most."""
    done = ssh(node["info"], node["host"],
               "for _ in $(seq 20); do left=$(ps -eo pid,args | grep -E '[s]leep 86400|[a]pt-get|[/]usr/lib/apt/methods'; "
               "flock -n /var/lib/apt/lists/lock true || echo LOCK-HELD); [ -z \"$left\" ] && break; sleep 1; done; "
               "echo \"$left\"")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_hung_try_is_stopped_with_what_it_started_and_the_next_try_reads_the_source(node):
    fresh(node, hang_always=False)
    run = package_source(node, tries=2)
    assert run.returncode == 0, run.stdout[-4000:]
    assert f"reading the sources try 1: stopped at {TRY_S} s with the" in run.stdout, run.stdout[-4000:]
    assert "reading the sources try 2: exit 0" in run.stdout, run.stdout[-4000:]
    policy = ssh(node["info"], node["host"], "apt-cache policy gpuboot-probe")
    assert "Candidate: 1.0" in policy.stdout, policy.stdout
    assert left_behind(node) == ""
    # Nothing changed since: a second run reads nothing again and changes nothing.
    again = package_source(node, tries=2)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-4000:]


def test_a_package_manager_that_never_finishes_fails_the_task_after_its_tries_and_frees_the_node(node):
    fresh(node, hang_always=True)
    run = package_source(node, tries=2)
    assert run.returncode != 0, run.stdout[-4000:]
    failed = run.stdout[run.stdout.index("fatal: ["):]
    assert "read the sources again now that they changed" in run.stdout
    assert f"apt-get (reading the sources) did not finish in {TRY_S} s on 2 of 2 tries" in failed, failed
    assert "hung_tries: 2" in failed, failed
    assert failed.count(f"stopped at {TRY_S} s with the") == 2, failed
    # Every try was stopped with the method it started, and apt's lock is free for the next run.
    assert left_behind(node) == ""
