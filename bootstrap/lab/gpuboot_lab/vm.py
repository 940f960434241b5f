"""The slow lab flavour: Debian 12 VMs under software emulation (TCG), for the few checks
that need a kernel of their own (modprobe, sysctl, swapoff, initramfs). KVM does not boot
here, so VMs are kept to one or two and their tests are marked slow.

Networking is qemu's user mode with restrict=on: the VM reaches nothing, and only its SSH
port is forwarded to a loopback port on this machine."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from gpuboot.net import free_port
from gpuboot_lab import LAB_RELEASE
from gpuboot_lab.errors import LabError
from gpuboot_lab.image import PACKAGES, RECIPE_VERSION, SUITE, debian_sources
from gpuboot_lab.process import stop_own_process

# chrony is baked in: os_prep installs it, and VMs have no package source (restrict=on).
VM_PACKAGES = [*PACKAGES, "linux-image-amd64", "initramfs-tools", "chrony", "e2fsprogs", "udev"]
DISK_SIZE = "3G"


def _hook(name: str) -> Path:
    return Path(str(resources.files("gpuboot_lab") / "files" / name))


@dataclass
class VmState:
    name: str
    vms: dict[str, dict] = field(default_factory=dict)  # name -> {port, pid, overlay}
    inventory: str = ""


class VmLab:
    def __init__(self, lab_dir: Path, cache_dir: Path, log=print) -> None:
        for tool in ("qemu-system-x86_64", "qemu-img", "mke2fs", "mmdebstrap"):
            if shutil.which(tool) is None:
                raise LabError(f"{tool} is not installed",
                               hint="apt-get install qemu-system-x86 qemu-utils e2fsprogs mmdebstrap")
        self.dir = lab_dir.resolve()
        self.cache_dir = cache_dir
        self.log = log

    # -- image ---------------------------------------------------------------------------
    def _key(self) -> Path:
        key = self.cache_dir / "vm_id_ed25519"
        if not key.exists():
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuboot-lab-vm", "-f", str(key)],
                           check=True)
        return key

    def image(self) -> Path:
        """A directory with base.raw, vmlinuz and initrd.img, built once per recipe."""
        key = self._key()
        digest = hashlib.sha256()
        for part in (RECIPE_VERSION, SUITE, " ".join(VM_PACKAGES), DISK_SIZE,
                     _hook("customize-node.sh").read_text(), _hook("customize-vm.sh").read_text(),
                     Path(f"{key}.pub").read_text()):
            digest.update(part.encode())
        out = self.cache_dir / f"vm-{digest.hexdigest()[:12]}"
        if (out / "base.raw").exists():
            return out
        self.log(f"building the lab VM image {out.name} (a few minutes, cached afterwards)")
        work = Path(tempfile.mkdtemp(prefix="gpuboot-vm-", dir=self.cache_dir))
        root = work / "root"
        env = dict(os.environ, GPUBOOT_VM_PUBKEY=Path(f"{key}.pub").read_text().strip())
        cmd = ["mmdebstrap", "--variant=minbase", "--format=directory", f"--include={','.join(VM_PACKAGES)}",
               f"--customize-hook={_hook('customize-node.sh')} \"$1\"",
               f"--customize-hook={_hook('customize-vm.sh')} \"$1\"",
               SUITE, str(root), *debian_sources()]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            raise LabError("building the lab VM image failed:\n" + "\n".join(proc.stderr.splitlines()[-15:]))
        kernel = sorted((root / "boot").glob("vmlinuz-*"))[-1]
        initrd = sorted((root / "boot").glob("initrd.img-*"))[-1]
        shutil.copy(kernel, work / "vmlinuz")
        shutil.copy(initrd, work / "initrd.img")
        subprocess.run(["mke2fs", "-q", "-t", "ext4", "-L", "root", "-d", str(root), str(work / "base.raw"), DISK_SIZE],
                       check=True, capture_output=True)
        shutil.rmtree(root)
        os.replace(work, out)
        return out

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.dir / "vm.json"

    def load(self) -> VmState | None:
        if not self.state_file.exists():
            return None
        return VmState(**json.loads(self.state_file.read_text()))

    def _save(self, state: VmState) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(asdict(state), indent=2))

    def up(self, name: str, count: int, inventory: Path, memory_mib: int = 1024) -> VmState:
        if self.load() is not None:
            raise LabError(f"VM lab {name} exists already", hint="run `gpuboot lab vm-down` first")
        image = self.image()
        state = VmState(name=name)
        self._save(state)
        for index in range(1, count + 1):
            host = f"{name}{index}"
            port = free_port()
            overlay = self.dir / f"{host}.qcow2"
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image / "base.raw"), "-F", "raw",
                            str(overlay)], check=True)
            pidfile = self.dir / f"{host}.pid"
            subprocess.run([
                "qemu-system-x86_64", "-name", host, "-machine", "q35,accel=tcg", "-cpu", "max",
                "-m", str(memory_mib), "-smp", "2", "-display", "none",
                "-serial", f"file:{self.dir / (host + '.console.log')}",
                "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"),
                "-append", f"root=/dev/vda rw console=ttyS0 net.ifnames=0 systemd.hostname={host}",
                "-drive", f"file={overlay},if=virtio,format=qcow2",
                "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
                "-device", "virtio-net-pci,netdev=n0",
                "-daemonize", "-pidfile", str(pidfile)], check=True, capture_output=True)
            state.vms[host] = {"port": port, "pid": int(pidfile.read_text()), "overlay": str(overlay)}
            self._save(state)
        known = self._wait_for_ssh(state)
        state.inventory = str(inventory)
        self._write_inventory(state, inventory, known)
        self._save(state)
        return state

    def _wait_for_ssh(self, state: VmState, timeout: float = 600) -> Path:
        t0 = time.monotonic()
        lines: dict[str, str] = {}
        while len(lines) < len(state.vms) and time.monotonic() - t0 < timeout:
            for host, vm in state.vms.items():
                if host in lines:
                    continue
                scan = subprocess.run(["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(vm["port"]), "127.0.0.1"],
                                      capture_output=True, text=True)
                found = [line for line in scan.stdout.splitlines() if line and not line.startswith("#")]
                if found:
                    lines[host] = found[0]
            time.sleep(2)
        if len(lines) < len(state.vms):
            missing = sorted(set(state.vms) - set(lines))
            raise LabError(f"no SSH from VMs {', '.join(missing)} after {timeout:.0f}s",
                           hint=f"read {self.dir}/<vm>.console.log; `gpuboot lab vm-down` cleans up")
        self.log(f"{len(lines)} VM(s) answer SSH after {time.monotonic() - t0:.0f}s")
        known = self.dir / "known_hosts"
        known.write_text("\n".join(lines.values()) + "\n")
        return known

    def _write_inventory(self, state: VmState, path: Path, known: Path) -> None:
        hosts = {host: {"ansible_host": "127.0.0.1", "ansible_port": vm["port"]} for host, vm in state.vms.items()}
        inventory = {"all": {
            "vars": {
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_ssh_extra_args": f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes",
                "gpuboot": {"cluster_name": state.name, "release": LAB_RELEASE,
                            "control_plane": {"vip": "10.213.250.250"},
                            "ssh": {"user": "root", "private_key_file": str(self._key())}},
            },
            "children": {"control_plane": {"hosts": {h: v for h, v in list(hosts.items())[:1]}},
                         "workers": {"children": {"gpu_workers": {"hosts": dict(list(hosts.items())[1:]) or None}}}},
        }}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# Written by `gpuboot lab vm-up`: VMs with their own kernel (software emulation).\n"
                        + yaml.safe_dump(inventory, sort_keys=False))

    def down(self) -> list[str]:
        state = self.load()
        removed: list[str] = []
        if state is None:
            return removed
        for host, vm in state.vms.items():
            stop_own_process(vm.get("pid"), b"qemu-system")
            Path(vm["overlay"]).unlink(missing_ok=True)
            removed.append(host)
        if state.inventory:
            Path(state.inventory).unlink(missing_ok=True)
        self.state_file.unlink()
        return removed
