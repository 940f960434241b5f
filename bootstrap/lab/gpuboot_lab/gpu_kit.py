"""`gpuboot lab gpu-kit build`: what the real-GPU proof (tests/gpu/run.sh) carries to a GPU
machine that reaches nothing: containerd 2, runc, crictl and the NVIDIA container toolkit from
the Go module proxy, NVIDIA's gpu-feature-discovery from the k8s-device-plugin source tree,
the lab's pause, a probe image (Debian's busybox and glibc, no CUDA) as an OCI archive, and
the Python wheels Ansible needs there. The GPU machine's python3 has none of Ansible.

Each binary is cached by its module, version and the Go version under
~/.cache/gpuboot/gpu-kit; `pack` writes one compressed archive (the carry limit is 64 MiB)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuboot_lab.errors import LabError
from gpuboot_lab.kubernetes import PAUSE_SOURCE
from gpuboot_lab.locks import build_once, building
from gpuboot_lab.upstream import SOURCE_ROOT, source_git_dir

DEFAULT_CACHE = Path.home() / ".cache" / "gpuboot" / "gpu-kit"


@dataclass(frozen=True)
class GoTool:
    """One binary from a Go module on the proxy (source is None) or from a source tree."""

    name: str
    module: str
    version: str
    package: str
    cgo: bool = False
    source: str | None = None  # a public repository whose git tree the build reads (not on the proxy)
    version_var: str = ""  # the package variable the project's own release build sets with -X

    def ldflags(self) -> str:
        return "-s -w" + (f" -X {self.version_var}={self.version}" if self.version_var else "")

    def key(self, go_version: str) -> str:
        flags = hashlib.sha256(f"{self.module} {self.package} {self.cgo} {self.ldflags()}".encode()).hexdigest()[:8]
        return f"{self.name}-{self.version}-{go_version}-{flags}"


# The versions the GPU Operator v26.7.0 ships (toolkit v1.20.0, device plugin and GFD v0.20.0);
# containerd v2.4.2 with the runc its repository pins (script/setup/runc-version: v1.5.2);
# cri-tools at the newest Kubernetes minor.
CONTAINERD = "v2.4.2"
TOOLKIT = "v1.20.0"
TOOLS = (
    GoTool("containerd", "github.com/containerd/containerd/v2", CONTAINERD, "cmd/containerd",
           version_var="github.com/containerd/containerd/v2/version.Version"),
    GoTool("ctr", "github.com/containerd/containerd/v2", CONTAINERD, "cmd/ctr"),
    GoTool("containerd-shim-runc-v2", "github.com/containerd/containerd/v2", CONTAINERD, "cmd/containerd-shim-runc-v2"),
    # runc's nsenter is C: cgo, no seccomp (libseccomp is not needed to run a probe).
    GoTool("runc", "github.com/opencontainers/runc", "v1.5.2", "", cgo=True),
    GoTool("crictl", "sigs.k8s.io/cri-tools", "v1.37.0", "cmd/crictl", version_var="sigs.k8s.io/cri-tools/pkg/version.Version"),
    # NVML is loaded at run time through cgo's dlopen.
    GoTool("nvidia-ctk", "github.com/NVIDIA/nvidia-container-toolkit", TOOLKIT, "cmd/nvidia-ctk", cgo=True,
           version_var="github.com/NVIDIA/nvidia-container-toolkit/internal/info.version"),
    GoTool("nvidia-cdi-hook", "github.com/NVIDIA/nvidia-container-toolkit", TOOLKIT, "cmd/nvidia-cdi-hook", cgo=True,
           version_var="github.com/NVIDIA/nvidia-container-toolkit/internal/info.version"),
    GoTool("gpu-feature-discovery", "github.com/NVIDIA/k8s-device-plugin", "v0.20.0", "cmd/gpu-feature-discovery",
           cgo=True, source="NVIDIA/k8s-device-plugin",
           version_var="github.com/NVIDIA/k8s-device-plugin/internal/info.version"),
)
# Python wheels for Ansible on the GPU machine's Python 3.12 (jinja2, PyYAML, packaging and
# MarkupSafe are in its image already).
WHEELS = ("ansible-core==2.19.14", "resolvelib==1.2.1")
PROBE_IMAGE = "localhost/gpuboot-gpu-probe:v1"


def go_version() -> str:
    return subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()


def available_tools(root: Path = SOURCE_ROOT) -> tuple[tuple[GoTool, ...], list[str]]:
    """The tools this machine can build, and why any other cannot (its source tree is absent)."""
    found, missing = [], []
    for tool in TOOLS:
        if tool.source and source_git_dir(tool.source, root) is None:
            missing.append(f"{tool.name}: the {tool.source} source tree is not on this machine "
                           f"(it is not on the module proxy; bring github:{tool.source} under {root})")
        else:
            found.append(tool)
    return tuple(found), missing


class GpuKit:
    def __init__(self, cache_dir: Path = DEFAULT_CACHE, log: Callable[[str], None] = print) -> None:
        self.cache_dir, self.log = cache_dir, log

    def _env(self, tool: GoTool) -> dict[str, str]:
        return dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="1" if tool.cgo else "0",
                    GOMODCACHE=str(self.cache_dir / "gomodcache"), GOCACHE=str(self.cache_dir / "gocache"))

    def binary(self, tool: GoTool, go: str) -> Path:
        return self.cache_dir / "bin" / tool.key(go) / tool.name

    def build_tool(self, tool: GoTool, go: str) -> Path:
        binary = self.binary(tool, go)
        build_once(binary.parent, f"{tool.name} {tool.version}", binary.is_file,
                   lambda: self._build_tool(tool, go, binary), self.log)
        return binary

    def _build_tool(self, tool: GoTool, go: str, binary: Path) -> Path:
        log_file = binary.parent / "build.log"
        started = time.monotonic()
        self.log(f"{tool.name} {tool.version}: building (log {log_file})")
        flags = ["-trimpath", "-ldflags", tool.ldflags()]
        with log_file.open("w") as log, tempfile.TemporaryDirectory(prefix="gpu-kit-") as scratch:
            if tool.source:
                git_dir = source_git_dir(tool.source)
                if git_dir is None:
                    raise LabError(f"{tool.name} builds from the {tool.source} source tree, which is not on this machine",
                                   hint=f"bring github:{tool.source} onto the machine (it is not on the module proxy)")
                tree = Path(scratch) / "src"
                tree.mkdir()
                # The tree's tests/ holds a blob the public history lacks; the build needs none of it.
                archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", tool.version, "--", ".",
                                          ":!tests"], capture_output=True, check=False)
                if not archive.stdout:
                    raise LabError(f"git archive {tool.version} of {git_dir} gave nothing",
                                   hint=archive.stderr.decode(errors="replace")[-400:])
                subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
                env = self._env(tool) | {"GOFLAGS": "-mod=vendor", "GOPROXY": "off"}
                argv = ["go", "build", *flags, "-o", str(binary), f"./{tool.package}"]
                cwd = tree
            else:
                env = self._env(tool) | {"GOFLAGS": "-mod=mod", "GOBIN": str(binary.parent)}
                target = f"{tool.module}/{tool.package}" if tool.package else tool.module
                argv = ["go", "install", *flags, f"{target}@{tool.version}"]
                cwd = Path(scratch)
            proc = subprocess.run(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
        if proc.returncode != 0 or not binary.is_file():
            raise LabError(f"building {tool.name} {tool.version} failed", hint=f"see {log_file}")
        self.log(f"{tool.name} {tool.version}: built in {time.monotonic() - started:.0f} s")
        return binary

    def build_pause(self, go: str) -> Path:
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(PAUSE_SOURCE.iterdir()))).hexdigest()[:12]
        binary = self.cache_dir / "bin" / f"pause-{digest}-{go}" / "pause"
        if not binary.is_file():
            binary.parent.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=mod",
                       GOCACHE=str(self.cache_dir / "gocache"))
            subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=gpu-probe",
                            "-o", str(binary), "."], cwd=PAUSE_SOURCE, env=env, check=True, capture_output=True)
        return binary

    def build_probe_image(self, pause: Path) -> Path:
        """An OCI archive: Debian's static busybox, its glibc (nvidia-smi, which CDI mounts in from
        the driver root, is a glibc program) and the lab's pause as the entrypoint, so the same
        image serves as the pod sandbox. Keyed by the packages' versions and the pause binary."""
        versions = _package_versions(["busybox-static", "libc6"])
        key = hashlib.sha256((repr(versions) + hashlib.sha256(pause.read_bytes()).hexdigest()).encode()).hexdigest()[:12]
        archive = self.cache_dir / "image" / f"probe-{key}.oci.tar"
        if archive.is_file():
            return archive
        archive.parent.mkdir(parents=True, exist_ok=True)
        self.log(f"probe image: building {PROBE_IMAGE} (busybox-static and libc6 {versions['libc6']})")
        with tempfile.TemporaryDirectory(prefix="gpu-probe-") as scratch:
            root = Path(scratch) / "root"
            for sub in ("bin", "dev", "proc", "sys", "etc", "tmp", "usr/bin", "run"):
                (root / sub).mkdir(parents=True, exist_ok=True)
            debs = Path(scratch) / "debs"
            debs.mkdir()
            subprocess.run(["apt-get", "download", "-q", "libc6"], cwd=debs, check=True, capture_output=True)
            for deb in debs.glob("*.deb"):
                subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            shutil.copy2("/bin/busybox", root / "bin" / "busybox")
            for applet in ("sh", "ls", "cat", "echo", "sleep", "grep", "test", "true", "false"):
                (root / "bin" / applet).symlink_to("busybox")
            shutil.copy2(pause, root / "pause")
            (root / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
            (root / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
            rootfs = Path(scratch) / "rootfs.tar"
            with tarfile.open(rootfs, "w") as tar:
                tar.add(root, arcname=".")
            ref = f"{PROBE_IMAGE}-{key}"
            _podman("import", "--change", 'ENTRYPOINT ["/pause"]', str(rootfs), ref)
            partial = archive.with_suffix(".partial")
            try:
                _podman("save", "--format", "oci-archive", "-o", str(partial), ref)
            finally:
                _podman("rmi", ref)
            os.replace(partial, archive)
        return archive

    def build(self, tools: tuple[GoTool, ...] = TOOLS) -> dict[str, Path]:
        go = go_version()
        built = {tool.name: self.build_tool(tool, go) for tool in tools}
        with building(self.cache_dir / "bin", "the GPU kit's pause and probe image", self.log):
            built["pause"] = self.build_pause(go)
            built["probe.oci.tar"] = self.build_probe_image(built["pause"])
        return built

    def wheels(self) -> list[Path]:
        target = self.cache_dir / "wheels" / hashlib.sha256(" ".join(WHEELS).encode()).hexdigest()[:12]
        if not any(target.glob("*.whl")):
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run(["python3", "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", "3.12", "--implementation", "cp", "-d", str(target), *WHEELS],
                           check=True, capture_output=True)
        return sorted(target.glob("*.whl"))

    def stage(self, kit_dir: Path, node_files: dict[str, str], tools: tuple[GoTool, ...] = TOOLS) -> Path:
        """The kit's layout in a folder: bin/, probe.oci.tar, wheels/, node/ (the rendered files,
        name -> text) and versions.tsv."""
        built = self.build(tools)
        (kit_dir / "bin").mkdir(parents=True, exist_ok=True)
        for name, path in built.items():
            shutil.copy2(path, kit_dir / ("bin" if name != "probe.oci.tar" else "") / name)
        (kit_dir / "wheels").mkdir(exist_ok=True)
        for wheel in self.wheels():
            shutil.copy2(wheel, kit_dir / "wheels" / wheel.name)
        for name, text in node_files.items():
            (kit_dir / "node" / name).parent.mkdir(parents=True, exist_ok=True)
            (kit_dir / "node" / name).write_text(text)
        (kit_dir / "versions.tsv").write_text("".join(f"{t.name}\t{t.module}\t{t.version}\n" for t in tools))
        return kit_dir

    def pack(self, out_dir: Path, node_files: dict[str, str], tools: tuple[GoTool, ...] = TOOLS) -> Path:
        """One xz archive of the staged kit (what travels to the GPU machine: 64 MiB at most)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        archive = out_dir / "kit.tar.xz"
        with tempfile.TemporaryDirectory(prefix="gpu-kit-pack-") as scratch:
            stage = self.stage(Path(scratch), node_files, tools)
            subprocess.run(["tar", "-cJf", str(archive), "-C", str(stage), "."],
                           env=dict(os.environ, XZ_OPT="-6 -T2"), check=True)
        return archive


def _package_versions(packages: list[str]) -> dict[str, str]:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\n", *packages],
                         capture_output=True, text=True, check=False).stdout
    found = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    missing = [p for p in packages if p not in found]
    if missing:
        raise LabError(f"the probe image needs {', '.join(missing)} installed here", hint="run bootstrap/setup.sh")
    return found


def _podman(*args: str) -> None:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"podman {args[0]} failed: {proc.stderr.strip()[-400:]}", hint="check podman on this machine")


def node_files(inventory: Path, host: str) -> dict[str, str]:
    """What gpuboot would give the GPU node, rendered here by gpuboot's own code: the extra
    variables its phases get (settings and plans; file references only, never secrets) and
    the files container_runtime writes on it, by their path on the node."""
    from gpuboot.config.loader import load_cluster
    from gpuboot.phases import render

    cluster = load_cluster(inventory)
    if host not in {n.name for n in cluster.nodes}:
        raise LabError(f"{inventory} has no host {host}", hint="name a GPU worker of that inventory with --host")
    files = {"extravars.json": json.dumps(cluster.extravars(), indent=1, sort_keys=True)}
    for _, rendered in render.phase_files(cluster, "container_runtime"):
        if rendered.host == host:
            files["root" + rendered.dest] = rendered.text
    return files
