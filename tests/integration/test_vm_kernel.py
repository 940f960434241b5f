"""os_prep's kernel-level steps, proven in a VM with its own kernel (software emulation):
modules loaded now and after a reboot, sysctls applied and persisted, swap off now and at
boot, nouveau blacklisted inside the rebuilt initramfs, and a second run changing nothing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from gpuboot.cli.main import run
from gpuboot_lab.cluster import DEFAULT_CACHE
from gpuboot_lab.vm import VmLab
from tests.integration.conftest import edit_inventory

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    if shutil.which("qemu-system-x86_64") is None:
        if os.environ.get("GPUBOOT_REQUIRE_LAB") == "1":
            pytest.fail("qemu-system-x86_64 missing: the VM flavour is required here")
        pytest.skip("qemu-system-x86_64 missing")
    root = tmp_path_factory.mktemp("vm")
    lab = VmLab(root / "_lab" / "vm", DEFAULT_CACHE, log=lambda m: None)
    state = lab.up("vmtest", 1, root / "inventory.yml")
    yield {"lab": lab, "state": state, "inventory": root / "inventory.yml", "root": root}
    lab.down()


# The VM is emulated in software: with the machine's cores busy (CI runs two lanes) its sshd
# can take tens of seconds to send its banner. A connection that never reached the shell
# (ssh's own exit 255, nothing printed) is tried again; a command's failure is returned as is.
CONNECT_TIMEOUT = 45
CONNECT_TRIES = 4


def vm_ssh(vm, command: str, timeout: int = 120, tries: int = CONNECT_TRIES) -> subprocess.CompletedProcess[str]:
    port = vm["state"].vms["vmtest1"]["port"]
    argv = ["ssh", "-p", str(port), "-i", str(vm["lab"]._key()),
            "-o", f"UserKnownHostsFile={vm['lab'].dir / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
            "root@127.0.0.1", command]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + CONNECT_TIMEOUT)
    for _ in range(tries - 1):
        if not never_connected(result):
            break
        time.sleep(5)
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + CONNECT_TIMEOUT)
    return result


def never_connected(result: subprocess.CompletedProcess[str]) -> bool:
    """ssh gave up before the command could run: no connection, or no banner or key exchange."""
    return result.returncode == 255 and not result.stdout and any(
        sign in result.stderr for sign in ("banner exchange", "kex_exchange_identification",
                                           "Connection timed out", "Connection refused"))


def changed_tasks(out: str) -> list[str]:
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert events[-1]["status"] == "ok", events[-5:]
    return [e["task"] for e in events if e["event"] == "HostResult" and e["status"] == "changed"]


def test_os_prep_changes_the_running_kernel_and_the_boot(vm, tmp_path, capsys):
    # A node that has swap, as many installed servers do.
    setup = vm_ssh(vm, "fallocate -l 64M /swapfile && chmod 600 /swapfile && mkswap -q /swapfile && "
                       "swapon /swapfile && echo '/swapfile none swap sw 0 0' >> /etc/fstab && swapon --show=NAME")
    assert "/swapfile" in setup.stdout, setup.stderr
    inventory = edit_inventory(vm["inventory"], tmp_path / "inventory.yml",
                               # A host var: it outranks the playbook's group_vars mapping.
                               lambda d: d["all"]["children"]["control_plane"]["hosts"]["vmtest1"].update(
                                   # The emulated VM answers slowly under load (see vm_ssh).
                                   {"os_prep_blacklist_nouveau": True, "ansible_timeout": CONNECT_TIMEOUT}))

    assert run(["up", str(inventory), "--only", "os_prep", "--force", "--output", "json"]) == 0
    changed = changed_tasks(capsys.readouterr().out)
    for task in ("OS prep | turn swap off now", "OS prep | load kernel modules now", "OS prep | apply sysctls",
                 "OS prep | rebuild initramfs"):
        assert task in changed, (task, changed)

    def check_state():
        result = vm_ssh(vm, "lsmod | awk '{print $1}' | grep -x br_netfilter; "
                            "sysctl -n net.bridge.bridge-nf-call-iptables net.ipv4.ip_forward fs.inotify.max_user_watches; "
                            "echo swap=$(swapon --noheadings --show=NAME | wc -l); grep swapfile /etc/fstab; "
                            "lsinitramfs /boot/initrd.img-$(uname -r) | grep -c gpuboot-blacklist-nouveau.conf; "
                            "systemctl is-active chrony")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.split()
        assert lines[0] == "br_netfilter"
        assert lines[1:4] == ["1", "1", "1048576"]
        assert "swap=0" in lines
        assert "#" in result.stdout.split("swap=0")[1].splitlines()[1]  # the fstab line is commented out
        assert result.stdout.strip().splitlines()[-2] == "1"  # the blacklist is inside the initramfs
        assert lines[-1] == "active"

    check_state()
    # Idempotence on a real kernel: nothing changes, no handler fires.
    assert run(["up", str(inventory), "--only", "os_prep", "--force", "--output", "json"]) == 0
    assert changed_tasks(capsys.readouterr().out) == []

    # What was persisted holds after a reboot.
    vm_ssh(vm, "systemctl reboot", timeout=30, tries=1)  # never twice
    time.sleep(5)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if vm_ssh(vm, "systemctl is-system-running --wait", timeout=200, tries=1).returncode in (0, 1):
            break
        time.sleep(3)
    check_state()
