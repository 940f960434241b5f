"""`gpuboot lab up|down|status`: systemd containers with real sshd on a fenced network,
and an inventory for them that `gpuboot validate` accepts."""
from __future__ import annotations

import json
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from ipaddress import IPv4Network, ip_network
from pathlib import Path

import yaml

from gpuboot_lab import LAB_RELEASE, aptcache, firewall, gitserver
from gpuboot_lab import mirror as lab_mirror
from gpuboot_lab.errors import LabError
from gpuboot_lab.image import ensure_image
from gpuboot_lab.podman import Podman
from gpuboot_lab.process import listeners_on, process_group, stop_own_process

LABEL = "io.gpuboot_lab"
INOTIFY = "fs.inotify.max_user_instances"
DEFAULT_CACHE = Path.home() / ".cache" / "gpuboot" / "lab"


@dataclass(frozen=True)
class LabSpec:
    name: str = "lab"
    control_planes: int = 3
    workers: int = 2
    gpu_workers: int = 1
    subnet: str = "10.213.0.0/24"
    # plain: unprivileged systemd nodes | containerd: privileged, own /var/lib/containerd |
    # kubernetes: kind's node settings, for kubelet and real kubeadm (privileged, own /var)
    flavour: str = "plain"
    release: str = LAB_RELEASE

    def nodes(self) -> list[tuple[str, str]]:
        """(host name, group) in inventory order."""
        return ([(f"{self.name}-cp{i}", "control_plane") for i in range(1, self.control_planes + 1)]
                + [(f"{self.name}-w{i}", "workers") for i in range(1, self.workers + 1)]
                + [(f"{self.name}-gpu{i}", "gpu_workers") for i in range(1, self.gpu_workers + 1)])


@dataclass
class LabState:
    spec: LabSpec
    status: str = "creating"
    network: str = ""
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    acng_pid: int | None = None
    mirror_pid: int | None = None  # `gpuboot lab mirror`
    inventory: str = ""
    addresses: dict[str, str] = field(default_factory=dict)


def container_name(lab: str, host: str) -> str:
    """The podman container of a lab host (`<lab>-cp1`, or a host named without the lab's prefix)."""
    return f"gpuboot-{lab}-{host.removeprefix(lab + '-')}"


class Lab:
    def __init__(self, lab_dir: Path, cache_dir: Path = DEFAULT_CACHE, log=print) -> None:
        self.dir = lab_dir
        self.cache_dir = cache_dir
        self.log = log
        self.podman = Podman(cache_dir)

    @property
    def state_file(self) -> Path:
        return self.dir / "lab.json"

    def load(self) -> LabState | None:
        if not self.state_file.exists():
            return None
        raw = json.loads(self.state_file.read_text())
        return LabState(spec=LabSpec(**raw.pop("spec")), **raw)

    def _save(self, state: LabState) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(asdict(state), indent=2))

    # -- up ---------------------------------------------------------------------------
    def _check_free(self, spec: LabSpec, subnet: IPv4Network) -> None:
        if len(spec.nodes()) > subnet.num_addresses - 10:
            raise LabError(f"{len(spec.nodes())} nodes do not fit in {subnet}", hint="pass a larger --subnet")
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        for line in routes.splitlines():
            dest = line.split()[0]
            if dest == "default":
                continue
            try:
                net = ip_network(dest, strict=False)
            except ValueError:
                continue
            if net.overlaps(subnet):
                raise LabError(f"subnet {subnet} overlaps {net}, which is already in use on this machine",
                               hint="pass another --subnet, or run `gpuboot lab down` if it is an old lab")
        network = f"gpuboot-{spec.name}"
        if self.podman.exists("network", network):
            raise LabError(f"podman network {network} already exists (a half-finished earlier lab?)",
                           hint=f"run `gpuboot lab down --name {spec.name}` first")

    def up(self, spec: LabSpec, inventory_path: Path) -> LabState:
        existing = self.load()
        if existing is not None:
            if existing.status == "up":
                raise LabError(f"lab {spec.name} is already up ({len(existing.containers)} nodes)",
                               hint="use it, or run `gpuboot lab down` first")
            raise LabError(f"an earlier `lab up` for {spec.name} did not finish",
                           hint="run `gpuboot lab down` to clean it up, then `gpuboot lab up` again")
        subnet = ip_network(spec.subnet)
        self._check_free(spec, subnet)
        image = ensure_image(self.podman, self.cache_dir, self.log)
        state = LabState(spec=spec, network=f"gpuboot-{spec.name}")
        self._save(state)  # from here on, `lab down` can clean up whatever exists
        key = self._ssh_key()
        hosts = list(subnet.hosts())
        gateway = str(hosts[0])
        self.podman.run("network", "create", "--subnet", str(subnet), "--gateway", gateway,
                        "--disable-dns", "--label", f"{LABEL}={spec.name}", state.network)
        firewall.install(spec.name, subnet)
        nodes = spec.nodes()
        self._raise_inotify(state, len(nodes))
        state.addresses = {name: str(hosts[10 + i]) for i, (name, _) in enumerate(nodes)}
        add_hosts = [arg for name, ip in state.addresses.items() for arg in ("--add-host", f"{name}:{ip}")]
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda n: self._run_node(state, image, key, n, add_hosts), [n for n, _ in nodes]))
        self._save(state)
        # The bridge exists once the first node runs; the cache listens on its gateway.
        state.acng_pid = aptcache.start(self.dir / "apt-cache", gateway)
        self._save(state)
        known_hosts = self._wait_for_ssh(state)
        self.log(f"{len(nodes)} nodes answer SSH after {time.monotonic() - t0:.1f}s")
        state.inventory = str(inventory_path)
        write_inventory(spec, state, inventory_path, key, known_hosts, gateway)
        state.status = "up"
        self._save(state)
        return state

    def _raise_inotify(self, state: LabState, new_nodes: int) -> None:
        """systemd in every node holds inotify instances; the host's default of 128 runs out
        at about 20 nodes and the rest never start sshd. Raise it, and say so."""
        path = Path(f"/proc/sys/{INOTIFY.replace('.', '/')}")
        current = int(path.read_text())
        running = len(self.podman.containers(LABEL))
        needed = 256 + 16 * (running + new_nodes)
        if current >= needed:
            return
        # Shared by all labs on this machine: the last `lab down` puts the original back.
        record = self._sysctl_record()
        saved = json.loads(record.read_text()) if record.exists() else {}
        saved.setdefault(INOTIFY, current)
        record.write_text(json.dumps(saved))
        path.write_text(str(needed))
        self.log(f"raised host {INOTIFY} from {current} to {needed} for {running + new_nodes} lab nodes "
                 "(restored by `lab down`)")

    def _sysctl_record(self) -> Path:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        return self.cache_dir / "host-sysctls.json"

    def _restore_host_sysctls(self) -> list[str]:
        record = self._sysctl_record()
        if not record.exists() or self.podman.containers(LABEL):
            return []
        restored = []
        for key, value in json.loads(record.read_text()).items():
            Path(f"/proc/sys/{key.replace('.', '/')}").write_text(str(value))
            restored.append(f"host {key} back to {value}")
        record.unlink()
        return restored

    def _ssh_key(self) -> Path:
        key = self.dir / "id_ed25519"
        if not key.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuboot-lab", "-f", str(key)],
                           check=True)
        authorized = self.dir / "authorized_keys"
        authorized.write_text(Path(f"{key}.pub").read_text())
        authorized.chmod(0o644)
        return key

    def _run_node(self, state: LabState, image: str, key: Path, name: str, add_hosts: list[str]) -> None:
        spec = state.spec
        container = container_name(spec.name, name)
        args = [*self._container_args(state, container, name, state.addresses[name], add_hosts),
                "--sysctl", "net.ipv4.ip_nonlocal_bind=1", "--sysctl", "net.ipv4.ip_forward=1",
                "-v", f"{self.dir / 'authorized_keys'}:/home/gpuboot/.ssh/authorized_keys:ro"]
        if spec.flavour in ("containerd", "kubernetes"):
            # containerd's overlayfs snapshots cannot live on the node's own overlay root.
            volume = f"{container}-var"
            self.podman.run("volume", "create", "--label", f"{LABEL}={spec.name}", volume)
            state.volumes.append(volume)
            mount = "/var/lib/containerd" if spec.flavour == "containerd" else "/var"
            args += ["--privileged", "-v", f"{volume}:{mount}", "--tmpfs", "/tmp", "--tmpfs", "/run"]
            if spec.flavour == "kubernetes":
                # kind's lessons: kubelet reads kernel modules' metadata, and manages its own
                # cgroup tree below the node's, not the host's.
                args += ["--cgroupns", "private",
                         "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined"]
                if Path("/lib/modules").is_dir():  # absent where the kernel has everything built in
                    args += ["-v", "/lib/modules:/lib/modules:ro"]
        else:
            args += ["--cap-add", "SYS_ADMIN,NET_ADMIN,NET_RAW"]
        state.containers.append(container)
        self.podman.run(*args, image)

    def _container_args(self, state: LabState, container: str, hostname: str, address: str,
                        add_hosts: list[str]) -> list[str]:
        """`podman run` for a container of this lab: its label (`down` finds it by that), its
        network and address, systemd as PID 1, the lab's key authorized for root."""
        return ["run", "-d", "--name", container, "--hostname", hostname, "--label", f"{LABEL}={state.spec.name}",
                "--network", state.network, "--ip", address, "--dns=none", *add_hosts, "--systemd=always",
                "-v", f"{self.dir / 'authorized_keys'}:/root/.ssh/authorized_keys:ro"]

    def run_extra(self, name: str, address: str, mounts: list[Path], timeout: float = 120) -> str:
        """A container beside the lab's nodes, not one of them (no inventory entry): the node
        image with sshd at `address` on the lab's network, the nodes' names resolvable, `mounts`
        read-only at the same paths. `down` removes it with the nodes. Returns its known_hosts
        lines once its sshd answers."""
        state = self.load()
        if state is None:
            raise LabError(f"no lab under {self.dir}", hint="run `gpuboot lab up` first")
        image = ensure_image(self.podman, self.cache_dir, self.log)
        container = container_name(state.spec.name, name)
        add_hosts = [arg for node, ip in state.addresses.items() for arg in ("--add-host", f"{node}:{ip}")]
        self.podman.run("rm", "-f", container, check=False)
        self.podman.run(*self._container_args(state, container, f"{state.spec.name}-{name}", address, add_hosts),
                        "--cap-add", "SYS_ADMIN,NET_ADMIN,NET_RAW",
                        *[arg for path in mounts for arg in ("-v", f"{path}:{path}:ro")], image)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = host_key_lines(address)
            if lines:
                return "\n".join(lines) + "\n"
            time.sleep(0.5)
        raise LabError(f"no SSH after {timeout:.0f}s from {container} ({address})",
                       hint=f"see `podman logs {container}`; `gpuboot lab down` cleans up")

    def _wait_for_ssh(self, state: LabState, timeout: float = 180) -> Path:
        deadline = time.monotonic() + timeout
        pending = dict(state.addresses)
        keys: dict[str, str] = {}
        while pending and time.monotonic() < deadline:
            for name, ip in list(pending.items()):
                lines = host_key_lines(ip)
                if lines:
                    keys[name] = "\n".join(f"{name},{line}" for line in lines)
                    del pending[name]
            if pending:
                time.sleep(0.5)
        if pending:
            raise LabError(f"no SSH after {timeout:.0f}s from: {', '.join(sorted(pending))}",
                           hint="see `podman logs` of those containers; `gpuboot lab down` cleans up")
        known = self.dir / "known_hosts"
        known.write_text("\n".join(keys[n] for n in state.addresses) + "\n")
        return known

    # -- down / status --------------------------------------------------------------------
    def down(self, name: str) -> list[str]:
        """Remove everything this lab created, found by state file and by label."""
        removed: list[str] = []
        state = self.load()
        label = f"{LABEL}={name}"
        containers = set(self.podman.names("container", label)) | set(state.containers if state else [])
        if containers:
            self.podman.run("rm", "-f", "-t", "0", *sorted(containers), check=False, timeout=300)
            removed += sorted(containers)
        volumes = set(self.podman.names("volume", label)) | set(state.volumes if state else [])
        for volume in sorted(volumes):
            self.podman.run("volume", "rm", "-f", volume, check=False)
            removed.append(volume)
        network = f"gpuboot-{name}"
        if self.podman.exists("network", network):
            removed += self._stop_leftovers(network)
            self.podman.run("network", "rm", "-f", network)
            removed.append(network)
        if firewall.exists(name):
            firewall.remove(name)
            removed.append(f"nft table {firewall.table_name(name)}")
        removed += self._restore_host_sysctls()
        if state is not None:
            if lab_mirror.stop(state.mirror_pid):
                removed.append(f"lab mirror pid {state.mirror_pid}")
            aptcache.stop(state.acng_pid)
            if state.acng_pid:
                removed.append(f"apt-cacher-ng pid {state.acng_pid}")
            if state.inventory and Path(state.inventory).exists():
                Path(state.inventory).unlink()
                removed.append(state.inventory)
            self.state_file.unlink()
        return removed

    def _stop_leftovers(self, network: str) -> list[str]:
        """The lab's apt cache, mirror and Git server listen on its network's gateway. A lab whose state was
        lost (its run was killed, or it was made under another state directory) still holds
        them: stop what listens there if it is one of them, so the next lab can bind again."""
        stopped = []
        for gateway in self.podman.network_gateways(network):
            # A registry the mirror started listens too: its process group leads to the mirror.
            listening = listeners_on(gateway)
            for pid in sorted(listening | {process_group(p) or p for p in listening}):
                for program, whole_group in ((b"apt-cacher-ng", False), (lab_mirror.PROGRAM, True),
                                             (gitserver.PROGRAM, True)):
                    if stop_own_process(pid, program, group=whole_group):
                        stopped.append(f"leftover {program.decode().replace(chr(0), ' ')} pid {pid} on {gateway}")
        return stopped

    def start_mirror(self, bundle: Path) -> LabState:
        state = self.load()
        if state is None or state.status != "up":
            raise LabError("no lab is up", hint="run `gpuboot lab up --flavour kubernetes` first")
        if lab_mirror.running(state.mirror_pid):
            # Same addresses as before, so the nodes' configuration stays as it is; the bundle is
            # added to what it holds (a second release before an upgrade).
            self.log(f"lab mirror already running (pid {state.mirror_pid}): importing {bundle} into it")
            lab_mirror.import_into(self.dir, Path(state.inventory), bundle, self.log)
            return state
        state.mirror_pid = lab_mirror.start(self.dir, state.spec.subnet, bundle, Path(state.inventory), self.log)
        self._save(state)
        return state

    def status(self) -> list[dict]:
        state = self.load()
        if state is None:
            return []
        running = {c["Names"][0]: c.get("State", "?") for c in self.podman.containers(f"{LABEL}={state.spec.name}")}
        rows = []
        for name, ip in state.addresses.items():
            container = container_name(state.spec.name, name)
            rows.append({"host": name, "address": ip, "container": container,
                         "state": running.get(container, "missing")})
        return rows


def host_key_lines(address: str) -> list[str]:
    """The ed25519 host key sshd at `address` offers, as known_hosts lines; none while it does
    not answer yet."""
    with socket.socket() as probe:
        probe.settimeout(0.5)
        if probe.connect_ex((address, 22)) != 0:
            return []
    scan = subprocess.run(["ssh-keyscan", "-T", "3", "-t", "ed25519", address], capture_output=True, text=True)
    return [line for line in scan.stdout.splitlines() if line and not line.startswith("#")]


def write_inventory(spec: LabSpec, state: LabState, path: Path, key: Path, known_hosts: Path, gateway: str) -> None:
    groups: dict[str, dict] = {"control_plane": {}, "workers": {}, "gpu_workers": {}}
    for name, group in spec.nodes():
        groups[group][name] = {"ansible_host": state.addresses[name]}
    subnet = ip_network(spec.subnet)
    vip = str(list(subnet.hosts())[-4])
    inventory = {"all": {
        "vars": {
            "ansible_python_interpreter": "/usr/bin/python3",
            # Plain `ansible-playbook -i` reads these; gpuboot.ssh below says the same for gpuboot.
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key),
            # Host keys were collected when the nodes first booted; checking stays on.
            "ansible_ssh_extra_args": f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes",
            "gpuboot": {
                "cluster_name": spec.name,
                "release": spec.release,
                "control_plane": {"vip": vip, "port": 8443, "mode": "keepalived_haproxy", "interface": "eth0"},
                "networking": {"pod_cidr": "10.244.0.0/16", "service_cidr": "10.96.0.0/12"},
                "ssh": {"user": "root", "private_key_file": str(key)},
                "mirror": {"air_gapped": False},
            },
        },
        "children": {
            "control_plane": {"hosts": groups["control_plane"]},
            "workers": {"hosts": groups["workers"] or None,
                        "children": {"gpu_workers": {"hosts": {
                            # Lab-only: these "GPU" workers have no GPU, so preflight must not ask for one.
                            name: {**vars_, "gpuboot_node": {"gpu": {}},
                                   "preflight_expect_gpu": False}
                            for name, vars_ in groups["gpu_workers"].items()} or None}}},
        },
    }}
    if spec.flavour == "kubernetes":
        inventory["all"]["vars"].update(kubernetes_node_settings())
        inventory["all"]["vars"]["gpuboot"]["networking"]["cni"] = "bridge"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Written by `gpuboot lab up` for lab '{spec.name}' ({spec.flavour} nodes). Removed by `gpuboot lab down`.\n"
              f"# The 'GPU' workers have no GPU: GPU facts are tested through doubles under tests/.\n")
    path.write_text(header + yaml.safe_dump(inventory, sort_keys=False, default_flow_style=False))


def host_has_cgroup_v1() -> bool:
    return not Path("/sys/fs/cgroup/cgroup.controllers").exists()


def kubernetes_node_settings() -> dict:
    """Lab-only role inputs for kubelet and kubeadm in containers (kind's lessons), each for
    a reason a bare-metal node does not have. Never defaults of the product."""
    kubelet: dict = {
        # The node's disk is the host's: kubelet must neither evict for it nor delete images.
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {"nodefs.available": "0%", "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
        # The host's swap shows through the container.
        "failSwapOn": False,
    }
    ignore: list[str] = []
    if host_has_cgroup_v1():
        # kubelet 1.35+ refuses cgroup v1 unless told; kubeadm's SystemVerification says the same.
        kubelet["failCgroupV1"] = False
        ignore.append("SystemVerification")
    return {
        # A container may not lower oom_score_adj below its own.
        "container_runtime_restrict_oom_score_adj": True,
        "kubeadm_init_kubelet_extra_config": kubelet,
        # conntrack's table size is the host's, not a container's to set.
        "kubeadm_init_kube_proxy_extra_config": {"conntrack": {"maxPerCore": 0}},
        "kubeadm_init_ignore_preflight_errors": ignore,
        "kubeadm_join_ignore_preflight_errors": ignore,
    }
