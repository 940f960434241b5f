"""NVIDIA's operators for the lab, built from their sources at the versions the release pins, as
images under the names the release matrix (and so the real chart) gives them: the lab's cluster
then runs the real controllers, not doubles of them.

- The GPU Operator from its repository's tree at the tag (`vendor/`: the module proxy refuses
  the module itself), with the files its Dockerfile copies (the operand manifests it reads at
  run time under /opt/gpu-operator, the CRDs its CRD-upgrade Job applies).
- The Network Operator from its repository's tree at the tag, through the module proxy (no
  `vendor/`), with the state manifests it renders operands from (/manifests, as its chart's
  STATE_MANIFEST_BASE_DIR says), the webhook schemas and the CRDs its upgrade hook applies.
- Node Feature Discovery from its module's own tree (its go.mod replaces the Kubernetes staging
  modules, which `go install module@version` does not honour; its nested api/nfd module comes
  from the proxy at the same version).

Upstream's code and files are inputs on this machine, never part of the project. Each binary is
cached by source, version and Go version under ~/.cache/gpuboot/operators."""
from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gpuboot.matrix import Release
from gpuboot.mirror.bundle import Artifact, Bundle
from gpuboot.mirror.refs import parse_image
from gpuboot_lab.artifacts import layered_image
from gpuboot_lab.debroot import rootfs_tar
from gpuboot_lab.errors import LabError
from gpuboot_lab.locks import build_once
from gpuboot_lab.upstream import SOURCE_ROOT, source_git_dir

DEFAULT_CACHE = Path.home() / ".cache" / "gpuboot" / "operators"
RECIPE_VERSION = "1"
# The upstream images' bases are distroless and Debian: a shell and CA roots are what their
# controllers and Jobs use of them.
BASE_PACKAGES = ["busybox-static", "ca-certificates"]
BASE_LINKS = {"/bin/sh": "busybox", "/usr/sbin/chroot": "/bin/busybox"}
# A pseudo-version (v0.0.0-20260421090033-dbd12d7e97a7): the commit is its last part.
PSEUDO_VERSION = re.compile(r"v\d+\.\d+\.\d+-(?:\S+\.)?\d{14}-([0-9a-f]{12})$")
# `path => ./dir`, alone on a replace line or in a replace block.
LOCAL_REPLACE = re.compile(r"^\s*(?:replace\s+)?(\S+)\s+=>\s+\./\S+\s*$", re.M)


@dataclass(frozen=True)
class OperatorImage:
    """One image of an operator: where its source is, what is built, what is copied in."""

    component: str  # the release's images section (gpu_operator)
    key: str  # the image's key there (operator, nfd)
    source: str  # "tree:<owner>/<name>" (a git directory on the machine) or "module:<module path>"
    binaries: tuple[tuple[str, str], ...]  # (file under bin_path, package directory in the tree)
    files: tuple[tuple[str, str], ...] = ()  # (path in the tree, path in the image), as the Dockerfile copies
    entrypoint: tuple[str, ...] = ()
    user: str = "0"
    # -X package.variable=value pairs of the project's own image build ({version}: the tag).
    variables: tuple[tuple[str, str], ...] = ()
    tags: str = ""
    # Where the binaries go in the image: the chart's commands name them there.
    bin_path: str = "usr/bin"
    # Folders of the tree left out of its archive (a tree whose history lacks some of their blobs).
    archive_excludes: tuple[str, ...] = ()
    # Dependencies the module proxy refuses (a pseudo-version of an unpublished commit): (module,
    # repository, the module's folder in it), each built from that repository's tree at the
    # commit its pseudo-version names.
    from_trees: tuple[tuple[str, str, str], ...] = ()
    # The source version to build, where the image's tag is not one (a vendor's build of an
    # upstream project, tagged by the vendor's release): the nearest upstream release.
    source_version: str = ""
    # A fork that tags a release only once it is out: where its tree lacks the tag, the newest
    # commit of this branch ({minor}: the tag's major.minor) is built, and said.
    release_branch: str = ""
    # busybox applets the image's own scripts run (linked in /bin beside the shell).
    applets: tuple[str, ...] = ()
    # Symbolic links (path in the image, target): a binary the Dockerfile copies to two places.
    links: tuple[tuple[str, str], ...] = ()
    # Empty folders the upstream image's base has and its binaries check for (distroless's /var/log).
    folders: tuple[str, ...] = ()

    def image_path(self, name: str) -> str:
        return f"{self.bin_path}/{name}" if self.bin_path else name

    def ldflags(self, version: str) -> str:
        return " ".join(["-s -w", *(f"-X {name}={value.format(version=version)}" for name, value in self.variables)])

    @property
    def kind(self) -> str:
        return self.source.split(":", 1)[0]

    @property
    def origin(self) -> str:
        return self.source.split(":", 1)[1]


# Node Feature Discovery, from its module: the GPU Operator's chart pins an upstream release.
NFD = OperatorImage(
    "gpu_operator", "nfd", "module:sigs.k8s.io/node-feature-discovery",
    binaries=(("nfd-master", "cmd/nfd-master"), ("nfd-worker", "cmd/nfd-worker"), ("nfd-gc", "cmd/nfd-gc")),
    files=(("deployment/components/worker-config/nfd-worker.conf.example",
            "etc/kubernetes/node-feature-discovery/nfd-worker.conf"),),
    # The container image's: the host's /sys, /proc, /etc are mounted under /host-*.
    variables=(("sigs.k8s.io/node-feature-discovery/pkg/version.version", "{version}"),
               ("sigs.k8s.io/node-feature-discovery/pkg/utils/hostpath.pathPrefix", "/host-")),
    # Its Dockerfile's USER: the chart's pods set runAsNonRoot, which a root image fails
    # (seen in the lab: CreateContainerConfigError on every NFD pod).
    user="65534:65534", tags="osusergo,netgo")

GPU_OPERATOR_CRDS = ("nvidia.com_clusterpolicies.yaml", "nvidia.com_nvidiadrivers.yaml", "nvidia.com_gpuclusters.yaml")
OPERATORS = (
    OperatorImage(
        "gpu_operator", "operator", "tree:NVIDIA/gpu-operator",
        binaries=(("gpu-operator", "cmd/gpu-operator"), ("manage-crds", "cmd/manage-crds"),
                  ("cleanup-gpuclusters", "cmd/cleanup-gpuclusters"), ("nvidia-validator", "cmd/nvidia-validator")),
        files=(("assets", "opt/gpu-operator"), ("manifests", "opt/gpu-operator/manifests"),
               ("validator/manifests", "opt/validator/manifests"),
               *((f"deployments/gpu-operator/crds/{crd}", f"opt/gpu-operator/{crd}") for crd in GPU_OPERATOR_CRDS),
               ("deployments/gpu-operator/charts/node-feature-discovery/crds/nfd-api-crds.yaml",
                "opt/gpu-operator/nfd-api-crds.yaml")),
        entrypoint=("/usr/bin/gpu-operator",), user="1000",
        variables=(("github.com/NVIDIA/gpu-operator/internal/info.version", "{version}"),)),
    NFD,
    # NVIDIA's k8s-device-plugin image: the device plugin, GPU Feature Discovery and the MPS
    # daemon read the GPUs through NVML, which needs a GPU, so the lab builds only its
    # config-manager (the device plugin's and GFD's config from a node label); a test adds the
    # others' doubles (`stand_ins`). Its tests/ has blobs the public history lacks.
    OperatorImage(
        "gpu_operator", "devicePlugin", "tree:NVIDIA/k8s-device-plugin",
        binaries=(("config-manager", "cmd/config-manager"),),
        variables=(("github.com/NVIDIA/k8s-device-plugin/internal/info.version", "{version}"),),
        entrypoint=("/usr/bin/nvidia-device-plugin",), archive_excludes=("tests",)),
    OperatorImage(
        "network_operator", "operator", "tree:Mellanox/network-operator",
        binaries=(("manager", "."), ("keep-ncp", "cmd/keep-ncp"), ("apply-crds", "cmd/apply-crds")),
        files=(("manifests", "manifests"), ("webhook-schemas", "webhook-schemas"),
               ("deployment/network-operator/crds", "crds/network-operator"),
               ("deployment/network-operator/charts/sriov-network-operator/crds", "crds/sriov-network-operator"),
               ("deployment/network-operator/charts/node-feature-discovery/crds", "crds/node-feature-discovery"),
               ("deployment/network-operator/charts/maintenance-operator-chart/crds", "crds/maintenance-operator")),
        entrypoint=("/manager",), user="65532:65532", bin_path="",
        variables=(("github.com/Mellanox/network-operator/version.Version", "{version}"),)),
    # The DOCA driver pod's init container: it reads its ConfigMap through the API and the
    # host's /proc and /sys, no NIC, so the lab runs the real one. Its repository tags each
    # Network Operator release (network-operator-vX), the tag the release's image has.
    OperatorImage(
        "network_operator", "initContainer", "tree:Mellanox/network-operator-init-container",
        binaries=(("network-operator-init-container", "cmd/network-operator-init-container"),),
        entrypoint=("/network-operator-init-container",), user="65532:65532", bin_path="",
        from_trees=(("github.com/Mellanox/doca-driver-build/entrypoint", "Mellanox/doca-driver-build", "entrypoint"),),
        variables=(("github.com/Mellanox/network-operator-init-container/pkg/utils/version.version", "{version}"),)),
    # The Network Operator chart's NFD (for a cluster without GPU nodes) is NVIDIA's build of a
    # fork published under the operator's tag, not as a module; its subchart at v26.4.1 is
    # upstream's chart of just before v0.19.0 (every flag it passes, v0.19.0 takes): the lab
    # builds upstream v0.19.0 under that name.
    replace(NFD, component="network_operator", source_version="v0.19.0"),
)

# NVIDIA's fork of the SR-IOV Network Operator (the Network Operator's sriov subchart runs it):
# its controller and the operand manifests it renders (bindata). One dependency is a
# pseudo-version the module proxy refuses, built from its repository's tree.
SRIOV_OPERATOR = OperatorImage(
    "network_operator", "sriovOperator", "tree:Mellanox/sriov-network-operator",
    binaries=(("sriov-network-operator", "."),), files=(("bindata", "bindata"),),
    entrypoint=("/usr/bin/sriov-network-operator",), user="65532:65532",
    from_trees=(("github.com/k8snetworkplumbingwg/dra-driver-sriov", "k8snetworkplumbingwg/dra-driver-sriov", ""),),
    release_branch="network-operator-{minor}.x")
# The CNI plugins the SR-IOV config daemon's init containers copy onto the node (--no-sleep):
# NVIDIA builds them from forks under the operator's tag; the lab builds upstream's release
# that fork follows, with the entrypoint script its image runs.
_CNI_APPLETS = ("awk", "cp", "mv", "rm", "echo", "sleep", "mkdir", "chmod", "cat", "test", "[")
SRIOV_CNIS = (
    OperatorImage("network_operator", "sriovCni", "tree:k8snetworkplumbingwg/sriov-cni",
                  binaries=(("sriov", "cmd/sriov"),), files=(("images/entrypoint.sh", "entrypoint.sh"),),
                  entrypoint=("/entrypoint.sh",), source_version="v2.10.0", applets=_CNI_APPLETS),
    OperatorImage("network_operator", "ibSriovCni", "tree:k8snetworkplumbingwg/ib-sriov-cni",
                  binaries=(("ib-sriov", "cmd/ib-sriov-cni"),), files=(("images/entrypoint.sh", "entrypoint.sh"),),
                  entrypoint=("/entrypoint.sh",), source_version="v1.3.0", applets=_CNI_APPLETS),
    OperatorImage("network_operator", "rdmaCni", "module:github.com/k8snetworkplumbingwg/rdma-cni",
                  binaries=(("rdma", "cmd/rdma"),), files=(("images/entrypoint.sh", "entrypoint.sh"),),
                  entrypoint=("/entrypoint.sh",), source_version="v1.3.0", applets=_CNI_APPLETS),
)

# The secondary networks' pieces the NicClusterPolicy deploys (NVIDIA builds them from forks under
# the operator's tag; the lab builds the upstream release each follows):
# - Multus, thin plugin (the policy's DaemonSet runs /install_multus --type thin, which copies
#   multus and passthru from /usr/src/multus-cni/bin, then /thin_entrypoint); `vendor/`.
# - nv-ipam: its controller, its node daemon and the CNI shim the daemon copies onto the node
#   (from /nv-ipam).
# - The container networking plugins (macvlan, host-local, ...): the policy's DaemonSet runs the
#   image's own entrypoint, which copies them onto the node and stays. NVIDIA's script is not
#   published; the lab's does that with busybox, replacing each file by rename (a plugin may be
#   running).
MULTUS_BIN = "usr/src/multus-cni/bin"
_CNI_PLUGINS = ("main/bridge", "main/host-device", "main/ipvlan", "main/loopback", "main/macvlan", "main/ptp",
                "main/vlan", "main/dummy", "main/tap", "ipam/dhcp", "ipam/host-local", "ipam/static",
                "meta/bandwidth", "meta/firewall", "meta/portmap", "meta/sbr", "meta/tuning", "meta/vrf")
CNI_PLUGINS_BIN = "usr/src/cni/bin"
_COPY_PLUGINS = (f"for f in /{CNI_PLUGINS_BIN}/*; do n=${{f##*/}}; cp \"$f\" \"/host/opt/cni/bin/.$n.new\" && "
                 f"mv -f \"/host/opt/cni/bin/.$n.new\" \"/host/opt/cni/bin/$n\" || exit 1; done; "
                 f"echo copied; while :; do sleep 3600; done")
SECONDARY_NETWORKS = (
    OperatorImage("network_operator", "multus", "tree:k8snetworkplumbingwg/multus-cni",
                  binaries=(("multus", "cmd/multus"), ("passthru", "cmd/passthru-cni"),
                            ("install_multus", "cmd/install_multus"), ("thin_entrypoint", "cmd/thin_entrypoint")),
                  bin_path=MULTUS_BIN, entrypoint=("/thin_entrypoint",), source_version="v4.3.0",
                  links=(("install_multus", f"/{MULTUS_BIN}/install_multus"),
                         ("thin_entrypoint", f"/{MULTUS_BIN}/thin_entrypoint")),
                  variables=(("gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus.version", "{version}"),)),
    OperatorImage("network_operator", "nvIpam", "tree:Mellanox/nvidia-k8s-ipam",
                  binaries=(("ipam-controller", "cmd/ipam-controller"), ("ipam-node", "cmd/ipam-node"),
                            ("nv-ipam", "cmd/nv-ipam")), bin_path="", user="0",
                  # The node daemon refuses to start unless its CNI shim's log folder exists.
                  folders=("var/log",)),
    OperatorImage("network_operator", "cniPlugins", "module:github.com/containernetworking/plugins",
                  binaries=tuple((name.split("/")[1], f"plugins/{name}") for name in _CNI_PLUGINS),
                  bin_path=CNI_PLUGINS_BIN, entrypoint=("/bin/sh", "-c", _COPY_PLUGINS), source_version="v1.9.1",
                  applets=("cp", "mv", "echo", "sleep")),
)

# kube-vip (control_plane.mode kube_vip), from its repository's tree at the tag (the module
# proxy refuses the module itself): the one static binary its image holds, as its Dockerfile
# puts it, with the version its Makefile links in.
KUBE_VIP = OperatorImage(
    "kube_vip", "manager", "tree:kube-vip/kube-vip", binaries=(("kube-vip", "."),),
    entrypoint=("/kube-vip",), bin_path="", variables=(("main.Version", "{version}"),))


def go_version() -> str:
    return subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()


class OperatorBuild:
    def __init__(self, cache_dir: Path = DEFAULT_CACHE, log: Callable[[str], None] = print,
                 sources: Path = SOURCE_ROOT) -> None:
        self.cache_dir, self.log, self.sources = cache_dir, log, sources

    def _env(self) -> dict[str, str]:
        return dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0",
                    GOMODCACHE=str(self.cache_dir / "gomodcache"), GOCACHE=str(self.cache_dir / "gocache"))

    def bin_dir(self, spec: OperatorImage, version: str) -> Path:
        recipe = hashlib.sha256(repr((RECIPE_VERSION, spec.source, spec.binaries, spec.variables,
                                      spec.tags) + ((spec.from_trees,) if spec.from_trees else ())
                                     ).encode()).hexdigest()[:8]
        name = spec.origin.replace("/", "+")
        return self.cache_dir / "bin" / f"{name}-{version}-{go_version()}-{recipe}"

    # -- sources ------------------------------------------------------------------------
    def _git_dir(self, spec: OperatorImage) -> Path:
        git_dir = source_git_dir(spec.origin, self.sources)
        if git_dir is None:
            raise LabError(f"{spec.origin}'s source tree is not on this machine (under {self.sources})",
                           hint=f"git clone --bare https://github.com/{spec.origin} "
                                f"{self.sources}/{spec.origin.replace('/', '+')}/repo")
        return git_dir

    def _module_dir(self, module: str, version: str) -> Path:
        proc = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], env=self._env(),
                              capture_output=True, text=True, check=False, timeout=900)
        found = re.search(r'"Dir":\s*"([^"]+)"', proc.stdout)
        if proc.returncode != 0 or not found:
            raise LabError(f"the module proxy has no {module}@{version}", hint=(proc.stdout + proc.stderr)[-400:])
        return Path(found.group(1))

    def tree(self, spec: OperatorImage, version: str, into: Path) -> Path:
        """A writable copy of the source at `version` (the tag, or the module version)."""
        into.mkdir(parents=True, exist_ok=True)
        if spec.kind == "tree":
            git_dir = self._git_dir(spec)
            excludes = [f":!{folder}" for folder in spec.archive_excludes]
            archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", version, *(["--", ".", *excludes]
                                                                                          if excludes else [])],
                                     capture_output=True, check=False)
            if archive.returncode != 0:
                raise LabError(f"{spec.origin} has no tag {version}", hint=archive.stderr.decode(errors="replace")[-300:])
            subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
        else:
            subprocess.run(["cp", "-r", f"{self._module_dir(spec.origin, version)}/.", str(into)], check=True)
            subprocess.run(["chmod", "-R", "u+w", str(into)], check=True)
            # A nested module of the repository is not in the module's zip: the proxy's copy of
            # it at the same version stands in for the `./dir` replace.
            go_mod = (into / "go.mod").read_text()
            for path in LOCAL_REPLACE.findall(go_mod):
                self._module_dir(path, version)
                subprocess.run(["go", "mod", "edit", f"-replace={path}={path}@{version}"], cwd=into, check=True,
                               env=self._env())
        self._from_trees(spec, into)
        return into

    def _from_trees(self, spec: OperatorImage, tree: Path) -> None:
        """Each dependency the proxy refuses, from its repository's tree at the commit its
        pseudo-version names, put in beside `tree` and replaced in."""
        go_mod = (tree / "go.mod").read_text()
        for module, repository, folder in spec.from_trees:
            found = re.search(rf"^\s*{re.escape(module)}\s+(\S+)", go_mod, re.M)
            if not found:
                continue
            commit = PSEUDO_VERSION.search(found.group(1))
            git_dir = source_git_dir(repository, self.sources)
            if commit is None or git_dir is None:
                raise LabError(f"{module} {found.group(1)}: the module proxy refuses it and {repository}'s source "
                               f"tree is not on this machine", hint=f"git clone --bare https://github.com/{repository} "
                               f"{self.sources}/{repository.replace('/', '+')}/repo")
            local = tree.parent / repository.replace("/", "+")
            local.mkdir(parents=True, exist_ok=True)
            archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", commit.group(1)], capture_output=True,
                                     check=True)
            subprocess.run(["tar", "-x", "-C", str(local)], input=archive.stdout, check=True)
            subprocess.run(["go", "mod", "edit", f"-replace={module}={local / folder}"], cwd=tree, check=True,
                           env=self._env())

    def revision(self, spec: OperatorImage, version: str) -> tuple[str, str]:
        """(what to build, what it is): `version`, or where a fork's tree lacks that tag, the
        newest commit of its release branch for that version."""
        if spec.kind != "tree" or not spec.release_branch:
            return version, version
        git_dir = self._git_dir(spec)

        def commit(ref: str) -> str | None:
            found = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                                   capture_output=True, text=True, check=False)
            return found.stdout.strip() or None

        if commit(f"refs/tags/{version}"):
            return version, f"tag {version}"
        minor = re.search(r"v?(\d+\.\d+)\.\d+", version)
        branch = spec.release_branch.format(minor=minor.group(1)) if minor else None
        head = commit(f"refs/heads/{branch}") if branch else None
        if head is None:
            raise LabError(f"{spec.origin}'s tree has neither the tag {version} nor the branch {branch}",
                           hint=f"git --git-dir={git_dir} fetch --tags")
        described = subprocess.run(["git", f"--git-dir={git_dir}", "describe", "--tags", head], capture_output=True,
                                   text=True, check=False).stdout.strip()
        return head, f"branch {branch} at {head[:12]} ({described}): the tag {version} is not in the stored tree"

    # -- builds ---------------------------------------------------------------------------
    def build(self, spec: OperatorImage, version: str) -> Path:
        out = self.bin_dir(spec, version)
        build_once(out, f"{spec.origin} {version}", lambda: all((out / name).is_file() for name, _ in spec.binaries),
                   lambda: self._build(spec, version, out), self.log)
        return out

    def _build(self, spec: OperatorImage, version: str, out: Path) -> Path:
        log_file = out / "build.log"
        started = time.monotonic()
        self.log(f"{spec.origin} {version}: building {', '.join(n for n, _ in spec.binaries)} (log {log_file})")
        with tempfile.TemporaryDirectory(prefix="gpuboot-operator-") as scratch, log_file.open("w") as log:
            tree = self.tree(spec, version, Path(scratch) / "src")
            env = self._env() | ({"GOFLAGS": "-mod=vendor", "GOPROXY": "off"} if (tree / "vendor").is_dir()
                                 else {"GOFLAGS": "-mod=mod"})
            for name, package in spec.binaries:
                tags = ["-tags", spec.tags] if spec.tags else []
                proc = subprocess.run(["go", "build", "-trimpath", *tags, "-ldflags", spec.ldflags(version),
                                       "-o", str(out / name), "." if package == "." else f"./{package}"], cwd=tree, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, check=False)
                if proc.returncode != 0:
                    raise LabError(f"building {name} of {spec.origin} {version} failed", hint=f"see {log_file}")
        self.log(f"{spec.origin} {version}: built in {time.monotonic() - started:.0f} s")
        return out

    def files(self, spec: OperatorImage, version: str) -> list[tuple[str, bytes, int]]:
        """(path in the image, content, mode) of every file the Dockerfile copies in."""
        found = []
        with tempfile.TemporaryDirectory(prefix="gpuboot-operator-files-") as scratch:
            tree = self.tree(spec, version, Path(scratch) / "src")
            for source, target in spec.files:
                path = tree / source
                if not path.exists():
                    raise LabError(f"{spec.origin} {version} has no {source}, which its image carries",
                                   hint="the operator's layout changed: update gpuboot_lab.operators")
                for item in sorted(path.rglob("*")) if path.is_dir() else [path]:
                    if item.is_file():
                        relative = item.relative_to(path) if path.is_dir() else Path()
                        image_path = str(Path(target) / relative)
                        # A tree keeps a script's mode; a module's zip does not, so the
                        # entrypoint is made runnable by name.
                        runnable = os.access(item, os.X_OK) or f"/{image_path}" in spec.entrypoint
                        found.append((image_path, item.read_bytes(), 0o755 if runnable else 0o644))
        return found


def _layer(entries: list[tuple[str, bytes, int]], links: tuple[tuple[str, str], ...] = (),
           folders: tuple[str, ...] = ()) -> bytes:
    """Files (path, content, mode), symbolic links (path, target) and empty folders."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(folders):
            info = tarfile.TarInfo(path)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for path, data, mode in sorted(entries):
            info = tarfile.TarInfo(path)
            info.mode, info.mtime, info.size = mode, 0, len(data)
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(links):
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
            tar.addfile(info)
    return buffer.getvalue()


def image_ref(release: Release, spec: OperatorImage) -> str:
    refs = (release.images or {}).get(spec.component) or {}
    ref = refs.get(spec.key) if isinstance(refs, dict) else None
    if not ref:
        raise LabError(f"release {release.name} names no {spec.component}.{spec.key} image",
                       hint=f"add it to mirror/releases/{release.name}.yml")
    return ref


def source_version(release: Release, spec: OperatorImage) -> str:
    """The version of the source an image is built from: its tag, unless the spec names another."""
    return spec.source_version or parse_image(image_ref(release, spec)).tag


def images(bundle: Bundle, release: Release, build: OperatorBuild | None = None,
           specs: tuple[OperatorImage, ...] = OPERATORS,
           stand_ins: dict[str, list[tuple[str, bytes, int]]] | None = None) -> list[Artifact]:
    """The release's images of `specs` (NVIDIA's operators), built here from their sources, into
    `bundle`. `stand_ins`: by image key, files a test adds in place of what upstream's image
    carries and the lab cannot build (the validator's CUDA sample needs a GPU: its test double)."""
    build = build or OperatorBuild()
    base = rootfs_tar(BASE_PACKAGES, build.cache_dir / "debroot", BASE_LINKS)
    built = []
    for spec in specs:
        ref = image_ref(release, spec)
        version, what = build.revision(spec, source_version(release, spec))
        bin_dir = build.build(spec, version)
        entries = [(spec.image_path(name), (bin_dir / name).read_bytes(), 0o755) for name, _ in spec.binaries]
        entries += build.files(spec, version)
        entries += (stand_ins or {}).get(spec.key, [])
        links = tuple((f"bin/{applet}", "busybox") for applet in spec.applets) + spec.links
        config = {"User": spec.user, **({"Entrypoint": list(spec.entrypoint)} if spec.entrypoint else {})}
        build.log(f"image {ref}" + (f" from {what}" if what != version else ""))
        built.append(layered_image(bundle, ref, [base, _layer(entries, links, spec.folders)], config))
    return built
