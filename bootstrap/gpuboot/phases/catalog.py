"""Phases are data. A Phase is one object: its playbook (which states its hosts, once), the
roles that playbook uses, what its nodes pull from the mirror, whether it is built for the
cluster's settings, and the result it leaves on the hosts (files, services) that tells a
later run whether the hosts still show it."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path

import yaml

from gpuboot import content, matrix
from gpuboot.config.model import Cluster, GpubootSettings
from gpuboot.mirror import caches

NOT_IMPLEMENTED_MARKER = "gpuboot_phase_not_implemented"


@dataclass(frozen=True)
class Result:
    """What a phase leaves on each of its hosts. A later run skips the phase only while every
    host still shows all of it (and the phase's inputs are unchanged)."""

    files: tuple[str, ...] = ()      # content must be unchanged (globs allowed)
    present: tuple[str, ...] = ()    # must exist (their content is others' to change)
    services: tuple[str, ...] = ()   # must be active
    # Lists of CIS file-permission entries (gpuboot_cis_file_modes) its files must meet.
    cis_modes: tuple[str, ...] = ()

    @property
    def observable(self) -> bool:
        return bool(self.files or self.present or self.services or self.cis_modes)

    def as_data(self) -> dict:
        entries = cis_file_modes()
        return {"files": list(self.files), "present": list(self.present), "services": list(self.services),
                "modes": [entry for name in self.cis_modes for entry in entries[name]]}


@cache
def cis_file_modes() -> dict[str, list[dict]]:
    """The CIS file-permission entries the kubeadm phases tighten, as the playbooks read them."""
    path = content.content_dir() / "playbooks" / "group_vars" / "all" / "cis_file_modes.yml"
    return yaml.safe_load(path.read_text())["gpuboot_cis_file_modes"]


# `{{ name }}`: a role's own setting inside a path in its files list.
ROLE_SETTING = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def _role_settings(role: str, part: str) -> dict:
    """roles/<role>/<part>/main.yml (defaults or vars), or nothing."""
    path = content.content_dir() / "roles" / role / part / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


@cache
def role_files(role: str) -> tuple[str, ...]:
    """Where the role puts the files it lists once as `<role>_files` (roles/<role>/vars/main.yml:
    its tasks write them, `gpuboot render` shows them), as a phase's result names them: a file
    written per loop item as a glob. The paths are read, never restated in the catalog."""
    scope = _role_settings(role, "defaults") | _role_settings(role, "vars")

    def resolve(text: str, seen: tuple[str, ...] = ()) -> str:
        def setting(found: re.Match) -> str:
            name = found.group(1)
            if name == "item":
                return "*"
            value = scope.get(name)
            if not isinstance(value, str) or name in seen:
                raise ValueError(f"roles/{role}: a path in {role}_files names {name}, which is not one of the role's "
                                 "own literal settings")
            return resolve(value, (*seen, name))
        resolved = ROLE_SETTING.sub(setting, text)
        if "{{" in resolved or "{%" in resolved:
            raise ValueError(f"roles/{role}: the path {text!r} in {role}_files is more than the role's own "
                             "literal settings")
        return resolved

    return tuple(resolve(entry["dest"]) for entry in scope[f"{role}_files"].values())




@cache
def addon_directory(role: str) -> str:
    """Where an add-on role writes what its chart is installed with (`<role>_dir` in its
    defaults): the phase's result and the GitOps repository's add-on directory read it there."""
    found = _role_settings(role, "defaults").get(f"{role}_dir")
    if not isinstance(found, str) or not found.startswith("/"):
        raise ValueError(f"roles/{role}/defaults/main.yml: {role}_dir, an absolute path, is what an add-on role "
                         "writes its chart's values and objects under")
    return found


def addon_files(role: str) -> tuple[str, ...]:
    """The files an add-on role leaves: every object and the values under its directory."""
    return (f"{addon_directory(role)}/*.yaml",)


def _tasks_files(tasks: list, base: Path) -> list[tuple[dict, Path]]:
    """(task, the directory its includes resolve from) for every task, following
    include_tasks/import_tasks into their files."""
    found: list[tuple[dict, Path]] = []
    for task in tasks or []:
        found.append((task, base))
        for key in ("block", "rescue", "always"):
            found += _tasks_files(task.get(key), base)
        for key in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks"):
            included = task.get(key)
            if isinstance(included, dict):
                included = included.get("file")
            if isinstance(included, str) and "{{" not in included:
                path = base / included
                found += _tasks_files(yaml.safe_load(path.read_text()) or [], path.parent)
    return found


@cache
def chart_release(playbook: str) -> str:
    """The Helm release the playbook installs (`chart_install_release` of its include of
    playbooks/tasks/install_chart.yml, however deep): one per add-on phase."""
    path = content.playbook(playbook)
    releases = {task["vars"]["chart_install_release"]
                for play in yaml.safe_load(path.read_text()) or []
                for key in ("pre_tasks", "tasks", "post_tasks")
                for task, _ in _tasks_files(play.get(key), path.parent)
                if "chart_install_release" in (task.get("vars") or {})}
    if len(releases) != 1:
        raise ValueError(f"playbooks/{playbook} installs {len(releases)} chart releases ({sorted(releases)}): "
                         "an add-on phase installs exactly one with tasks/install_chart.yml")
    return releases.pop()


Unbuilt = Callable[[GpubootSettings], "str | None"]


def _built(settings: GpubootSettings) -> str | None:
    return None


def _not_built(what: str) -> Unbuilt:
    return lambda settings: f"{what} is not built yet"


# A host pattern that picks one host of a group by its index (`control_plane[0]`), not a slice.
ONE_BY_POSITION = re.compile(r"\[-?\d+\]$")


@dataclass(frozen=True)
class Phase:
    name: str
    title: str
    playbook: str
    # What it leaves on its hosts; a function of the settings where that depends on them.
    result: Result | Callable[[GpubootSettings], Result] = Result()
    # The matrix components whose images nodes pull in this phase, and whether it installs
    # packages: in an air gap the mirror must hold them first (checked before it runs).
    pulls: tuple[str, ...] = ()
    installs_packages: bool = False
    # None when the phase is built for these settings, else why up stops at it.
    unbuilt: Unbuilt = field(default=_built, compare=False)
    # A read-only phase (preflight) leaves nothing on the hosts: it runs whenever a later
    # phase of the same run does.
    read_only: bool = False
    # A gate (validate) changes nothing and checks the whole cluster: it runs on every run
    # that reaches it, and does not make preflight run.
    gate: bool = False
    # Why the phase has nothing to do for this cluster (skipped, pulls nothing), or None.
    idle_when: Callable[[Cluster], str | None] = field(default=lambda cluster: None, compare=False)
    # Data only this phase reads (gitops_handoff: the repository's files), computed when it runs.
    # A repair runs it only on the hosts that lost its result (and those its plays pick by
    # position). False where one host's result depends on every other's (the bridge CNI's
    # static routes name every node's pod CIDR).
    repairs_per_host: bool = True
    # Each host's work needs no other host (no play picks a host by position, no task reads
    # another host's facts): with gpuboot.executors its hosts are split among them.
    node_local: bool = False
    # What a person reading `plan` should know about this phase for this cluster.
    notes: Callable[[Cluster], list[str]] = field(default=lambda cluster: [], compare=False)
    # The add-on role whose chart this phase installs and Argo CD takes over at the handoff:
    # the role names the release matrix's component, its directory the add-on's in Git.
    addon: str | None = None

    def idle(self, cluster: Cluster) -> str | None:
        return self.idle_when(cluster)

    def result_for(self, settings: GpubootSettings) -> Result:
        return self.result(settings) if callable(self.result) else self.result

    @property
    def path(self) -> Path:
        return content.playbook(self.playbook)

    @cached_property
    def plays(self) -> list[dict]:
        return yaml.safe_load(self.path.read_text()) or []

    @property
    def host_patterns(self) -> tuple[str, ...]:
        """Each play's host pattern, once each, in play order."""
        patterns: list[str] = []
        for play in self.plays:
            if play.get("hosts") and play["hosts"] not in patterns:
                patterns.append(play["hosts"])
        return tuple(patterns)

    @property
    def hosts(self) -> str:
        """Its plays' host patterns, for a person to read."""
        return ", ".join(self.host_patterns)

    def hosts_by_position(self, cluster: Cluster) -> list[str]:
        """The hosts its plays pick by position (`control_plane[0]`: where a join's credentials
        are made): a repair on other hosts needs them too."""
        return list(dict.fromkeys(h for pattern in self.host_patterns if ONE_BY_POSITION.search(pattern)
                                  for h in cluster.hosts_matching(pattern)))

    def hosts_in(self, cluster: Cluster) -> list[str]:
        """The hosts its plays target, in play and inventory order. Each play's pattern is
        resolved on its own: one pattern joined from all (`a:!b:c`) would apply every play's
        exclusions to the others."""
        return list(dict.fromkeys(h for pattern in self.host_patterns for h in cluster.hosts_matching(pattern)))

    @property
    def roles(self) -> tuple[str, ...]:
        """Every role the playbook applies, imports or includes (and their dependencies)."""
        found: list[str] = []

        def add(name: str) -> None:
            if name in found:
                return
            found.append(name)
            meta = content.content_dir() / "roles" / name / "meta" / "main.yml"
            if meta.is_file():
                for dep in (yaml.safe_load(meta.read_text()) or {}).get("dependencies") or []:
                    add(dep["role"] if isinstance(dep, dict) else dep)

        base = self.path.parent
        for play in self.plays:
            for role in play.get("roles") or []:
                add(role["role"] if isinstance(role, dict) else role)
            for key in ("pre_tasks", "tasks", "post_tasks"):
                for task, _ in _tasks_files(play.get(key), base):
                    for include in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                        if include in task:
                            add(task[include]["name"])
        return tuple(found)

    @property
    def implemented(self) -> bool:
        return not any(NOT_IMPLEMENTED_MARKER in (play.get("vars") or {}) for play in self.plays)

    def stops_because(self, settings: GpubootSettings) -> str | None:
        """Why `up` stops at this phase for these settings, or None when it can run."""
        if not self.implemented:
            return f"{self.name} is not built yet"
        return self.unbuilt(settings)

    @property
    def release(self) -> str | None:
        """The Helm release of its add-on (None for a phase without one)."""
        return chart_release(self.playbook) if self.addon else None

    def pulls_for(self, cluster: Cluster) -> tuple[str, ...]:
        if self.idle(cluster):
            return ()
        # The bridge CNI is plugins from a package; only Calico pulls images. kube-vip's image
        # is pulled only where it holds the VIP.
        dropped = {"calico"} if cluster.settings.networking.cni != "calico" else set()
        if cluster.settings.control_plane.mode != "kube_vip":
            dropped.add("kube_vip")
        return tuple(c for c in self.pulls if c not in dropped)


def _cni_result(settings: GpubootSettings) -> Result:
    """Calico's conflist, or the bridge's and its route service."""
    # calico-node's install-cni writes Calico's conflist on every node; the bridge is gpuboot's.
    if settings.networking.cni == "calico":
        return Result(present=("/etc/cni/net.d/10-calico.conflist",), services=("kubelet",))
    return Result(files=("/etc/cni/net.d/10-gpuboot-bridge.conflist",), services=("kubelet", "gpuboot-pod-routes"))


def _no_gpus(cluster: Cluster) -> str | None:
    return None if cluster.in_group("gpu_workers") else "the inventory has no gpu_workers"


def _no_nics(cluster: Cluster) -> str | None:
    fabric = any(nic.kind for n in cluster.nodes for nic in n.settings.nics)
    return None if fabric else "no node declares fabric NICs (RDMA or SR-IOV)"


def _no_gitops(cluster: Cluster) -> str | None:
    return None if cluster.settings.gitops else "gpuboot.gitops is not set"


def _gitops_unbuilt(settings: GpubootSettings) -> str | None:
    """The handoff pushes over SSH with a deploy key and checks the Git server's host key."""
    gitops = settings.gitops
    if gitops is None:
        return None
    if gitops.repo_url.startswith(("http://", "https://")):
        return ("gpuboot.gitops.repo_url is an HTTP(S) URL: the handoff pushes with an SSH deploy key; "
                "use ssh://git@HOST/PATH.git or git@HOST:PATH.git")
    missing = [name for name in ("credentials_file", "known_hosts_file") if not getattr(gitops, name)]
    if missing:
        return (f"gpuboot.gitops.{' and gpuboot.gitops.'.join(missing)} not set: the handoff needs the deploy key "
                "(credentials_file) and the Git server's host key (known_hosts_file, as ssh-keyscan prints it)")
    return None


def _endpoint_idle(cluster: Cluster) -> str | None:
    mode = cluster.settings.control_plane.mode
    return None if mode == "keepalived_haproxy" else f"control_plane.mode is {mode}: no keepalived or haproxy"


def _kube_vip_idle(cluster: Cluster) -> str | None:
    mode = cluster.settings.control_plane.mode
    return None if mode == "kube_vip" else f"control_plane.mode is {mode}"


def site_caches(settings: GpubootSettings) -> list[caches.Cache]:
    mirror = settings.mirror
    return caches.caches(mirror.registry, mirror.air_gapped, matrix.load(settings.release).upstream_registries,
                         mirror.cache_remotes)


def _mirror_result(settings: GpubootSettings) -> Result:
    """`/etc/docker/registry/config.yml`, docker-registry active; at a connected site each
    cache's configuration, its gpuboot-registry-cache@ unit active."""
    planned = site_caches(settings)
    return Result(files=("/etc/docker/registry/config.yml", *(f"/etc/docker/registry/cache-{c.upstream}.yml"
                                                              for c in planned)),
                  services=("docker-registry", *(f"gpuboot-registry-cache@{c.upstream}.service" for c in planned)))


def _mirror_notes(cluster: Cluster) -> list[str]:
    planned = site_caches(cluster.settings)
    return [f"pulls of {c.upstream} go to the cache {c.endpoint} first, then {c.server}"
            + ("" if c.remote == c.server else f" (the cache fetches from {c.remote})") for c in planned]


# package_source's files (whichever the node's family has; a path that is not there is not
# recorded, so a node without a mirror source has none to lose).
PACKAGE_SOURCE = ("/etc/apt/sources.list.d/gpuboot-mirror.list", "/etc/yum.repos.d/gpuboot-mirror.repo")
KUBELET = Result(present=("/etc/kubernetes/kubelet.conf",), services=("kubelet",), cis_modes=("node",))

UP: tuple[Phase, ...] = (
    # Only inventories with a `mirror` group run it (a phase without hosts is skipped).
    Phase("mirror", "Mirror registry (air gap) or pull-through caches", "mirror.yml", _mirror_result,
          notes=_mirror_notes),
    Phase("preflight", "Preflight checks", "preflight.yml", read_only=True),
    Phase("os_prep", "OS preparation", "os_prep.yml",
          Result(files=role_files("os_prep")), node_local=True),
    # It writes the package source kube_packages installs from too: a lost source runs it again.
    Phase("container_runtime", "Container runtime (containerd)", "container_runtime.yml",
          Result(files=(*role_files("container_runtime"), *PACKAGE_SOURCE),
                 services=("containerd",)), node_local=True),
    Phase("kube_packages", "Pinned kubeadm, kubelet, kubectl", "kube_packages.yml",
          Result(files=("/usr/bin/kubeadm", "/usr/bin/kubelet", "/usr/bin/kubectl")), installs_packages=True,
          node_local=True),
    Phase("ha_endpoint", "HA API endpoint (VIP)", "ha_endpoint.yml",
          Result(files=role_files("ha_endpoint"),
                 services=("haproxy", "keepalived")), idle_when=_endpoint_idle),
    Phase("control_plane_init", "First control plane (kubeadm init)", "control_plane_init.yml",
          Result(present=("/etc/kubernetes/admin.conf", "/etc/kubernetes/kubelet.conf",
                           # kubeadm_init's mark of a finished init: admin.conf comes early in kubeadm's init
                           "/etc/kubernetes/gpuboot/init-finished"), services=("kubelet",),
                 cis_modes=("node", "control_plane")),
          pulls=("kubernetes", "kube_vip")),
    Phase("control_plane_join", "Control-plane joins", "control_plane_join.yml",
          Result(present=("/etc/kubernetes/kubelet.conf",), services=("kubelet",), cis_modes=("node", "control_plane")),
          pulls=("kubernetes", "kube_vip")),
    # With control_plane.mode kube_vip: the first control plane started it for its init, the
    # others after their joins; this phase owns the manifest, so a lost one comes back.
    Phase("kube_vip", "kube-vip on the control planes (VIP)", "kube_vip.yml",
          Result(files=role_files("kube_vip")), pulls=("kube_vip",), idle_when=_kube_vip_idle),
    Phase("workers_join", "Worker joins", "workers_join.yml", KUBELET, pulls=("kubernetes",)),
    Phase("cni", "Pod network (Calico, or bridge)", "cni.yml", _cni_result, pulls=("calico",),
          repairs_per_host=False, addon="calico"),
    # What gpuboot applies lives on the first control plane; the objects live in the cluster.
    # The GPU Operator first: its Node Feature Discovery is the cluster's one NFD (NVIDIA's
    # advice), and the Network Operator deploys the DOCA driver and the device plugins only on
    # nodes NFD labelled (a Mellanox NIC, the OS, the kernel): installed first, it waits for
    # labels nothing gives yet. With GPUDirect RDMA over DMA-BUF (no nvidia-peermem) the GPU
    # driver needs nothing of the NIC driver. A cluster with NICs and no GPU nodes gets the
    # Network Operator's own NFD (gpuboot.nic_plan).
    Phase("gpu_operator", "NVIDIA GPU Operator", "gpu_operator.yml",
          Result(files=addon_files("gpu_operator")), pulls=("gpu_operator",), idle_when=_no_gpus,
          addon="gpu_operator"),
    Phase("network_operator", "NVIDIA Network Operator", "network_operator.yml",
          Result(files=addon_files("network_operator")), pulls=("network_operator",),
          idle_when=_no_nics, addon="network_operator"),
    # The gate: it only reads (its smoke pods are deleted), so it runs whenever `up` reaches it.
    Phase("validate", "Cluster validation", "validate.yml", pulls=("validate",), gate=True),
    # Argo CD from the mirror, the rendered repository pushed once, then Git owns the add-ons.
    Phase("gitops_handoff", "GitOps handoff (Argo CD)", "gitops_handoff.yml",
          Result(files=addon_files("argocd")), pulls=("argocd",),
          unbuilt=_gitops_unbuilt, idle_when=_no_gitops),
)

# The snapshot `gpuboot upgrade` takes first is also `gpuboot etcd snapshot` on its own.
SNAPSHOT = Phase("etcd_snapshot", "etcd snapshot", "etcd_snapshot.yml")

# `gpuboot upgrade`: every phase runs on every upgrade run (each node step skips a node that is
# already at the target), so a re-run with --resume continues where a run stopped.
UPGRADE: tuple[Phase, ...] = (
    Phase("upgrade_preflight", "Upgrade checks", "upgrade_preflight.yml", read_only=True),
    SNAPSHOT,
    Phase("upgrade_control_planes", "Control planes, one at a time", "upgrade_control_planes.yml",
          pulls=("kubernetes",), installs_packages=True),
    Phase("upgrade_workers", "Workers: canary, then batches", "upgrade_workers.yml",
          pulls=("kubernetes",), installs_packages=True),
    # Only where the target release moves an operator-managed GPU driver (the plan says so):
    # the operator's upgrade controller does the node work, gpuboot follows it.
    Phase("upgrade_gpu_driver", "GPU drivers, by the GPU Operator", "upgrade_gpu_driver.yml",
          pulls=("gpu_operator",), idle_when=_no_gpus),
)

# `gpuboot etcd snapshot` and `gpuboot etcd restore`: actions, run whenever asked.
ETCD_SNAPSHOT: tuple[Phase, ...] = (SNAPSHOT,)
ETCD_RESTORE: tuple[Phase, ...] = (Phase("etcd_restore", "etcd restore (the whole control plane)", "etcd_restore.yml"),)

# `gpuboot node remove` and `gpuboot reset`: actions on the hosts, run whenever asked.
NODE_REMOVE: tuple[Phase, ...] = (Phase("node_remove", "Node removal", "node_remove.yml"),)
RESET: tuple[Phase, ...] = (Phase("reset", "Cluster reset (kubeadm reset on every node)", "reset.yml"),)

CATALOGS = {"up": UP, "upgrade": UPGRADE, "etcd snapshot": ETCD_SNAPSHOT, "etcd restore": ETCD_RESTORE,
            "node remove": NODE_REMOVE, "reset": RESET}


def by_name(catalog: tuple[Phase, ...]) -> dict[str, Phase]:
    return {p.name: p for p in catalog}
