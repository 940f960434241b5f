"""`gpuboot lab kubernetes bundle`: the built Kubernetes as a real user's mirror would hold
it, written as a gpuboot bundle (the same format `mirror pull` writes, entering the lab's
mirror through `mirror import` like any other bundle):

- OCI images named exactly as `kubeadm config images list` prints them, each the static
  binary on an empty root (built here, nothing pulled), kube-proxy's over iptables from
  Debian packages;
- .deb packages kubeadm, kubelet (with its systemd unit and kubeadm drop-in), kubectl and
  kubernetes-cni at the matrix's package versions for debian-12.

- cri-tools (crictl) at the matrix's package version, built from the lab_build version of
  sigs.k8s.io/cri-tools, which the lab's kubeadm depends on as upstream's does.
- containerd.io at the matrix's Debian 12 version: containerd 2, ctr, the runc shim and runc
  from the lab_build versions, with a systemd unit, in place of Debian's containerd and runc
  as Docker's package is.

What the lab cannot build is listed, not faked (a release without lab_build.cri_tools lists
cri-tools). etcd, CoreDNS and crictl are built at the matrix's lab_build versions (the nearest
the proxy has) and tagged or packaged as kubeadm expects."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gpuboot import matrix
from gpuboot.mirror.bundle import Artifact, Bundle
from gpuboot.mirror.packages import DEB, write_index
from gpuboot.mirror.refs import parse_image
from gpuboot_lab.debroot import rootfs_tar
from gpuboot_lab.errors import LabError
from gpuboot_lab.kubernetes import COMPANION_COMMANDS, KubernetesBuild, matrix_versions
from gpuboot_lab.locks import build_once

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
PATH_ENV = "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
# kubeadm's image names -> the binary inside, where it lives, and how the image starts.
IMAGE_BINARIES = {
    "kube-apiserver": ("usr/local/bin/kube-apiserver", None),
    "kube-controller-manager": ("usr/local/bin/kube-controller-manager", None),
    "kube-scheduler": ("usr/local/bin/kube-scheduler", None),
    "kube-proxy": ("usr/local/bin/kube-proxy", None),
    "etcd": ("usr/local/bin/etcd", None),
    "coredns": ("coredns", ["/coredns"]),
    "pause": ("pause", ["/pause"]),
}
KUBELET_UNIT = """[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""
# The drop-in kubeadm's packages ship: kubeadm writes the files it reads.
KUBEADM_DROP_IN = """[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"""
# containerd's unit, as a packaged containerd needs it: Delegate lets it manage its
# containers' cgroups, KillMode=process leaves the shims (and so every container) running
# while containerd itself restarts or is upgraded.
CONTAINERD_UNIT = """[Unit]
Description=containerd container runtime (gpuboot lab build)
After=network.target local-fs.target

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNOFILE=infinity
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
"""
RUNTIME_REPOSITORIES = Path.home() / ".cache" / "gpuboot" / "runtime-apt"
# containerd.io carries runc and replaces the distribution's separate packages.
CONTAINERD_IO_FIELDS = {"Provides": "containerd, runc", "Conflicts": "containerd, runc", "Replaces": "containerd, runc"}


class Deb(NamedTuple):
    name: str
    version: str
    files: dict[str, tuple[bytes, int]]
    depends: str
    description: str
    fields: dict[str, str] | None = None


@dataclass
class LabBundle:
    path: Path
    images: list[str]
    packages: list[str]
    not_built: list[str]


def layer_tar(entries: list[tuple[str, bytes, int]]) -> bytes:
    """An uncompressed layer: (path, content, mode) entries with time 0 (reproducible digests)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def image_artifact(bundle: Bundle, ref: str, path_in_image: str, binary: bytes,
                   entrypoint: list[str] | None, base: bytes | None = None,
                   companions: dict[str, bytes] | None = None) -> Artifact:
    """An amd64 image: the binary at its path with PATH set (and companion binaries beside it:
    etcd's etcdctl and etcdutl), over an optional base layer (a tar: kube-proxy's iptables from
    Debian packages)."""
    folder = path_in_image.rsplit("/", 1)[0] + "/" if "/" in path_in_image else ""
    entries = [(path_in_image, binary, 0o755)] + [(folder + name, data, 0o755)
                                                  for name, data in sorted((companions or {}).items())]
    layer_tars = ([base] if base else []) + [layer_tar(entries)]
    return layered_image(bundle, ref, layer_tars, {"Entrypoint": entrypoint} if entrypoint else {})


def layered_image(bundle: Bundle, ref: str, layer_tars: list[bytes], config: dict) -> Artifact:
    """An amd64 image of uncompressed layer tars (lowest first) and the config's fields
    (Entrypoint, User, WorkingDir, Env beyond PATH)."""
    layers = [bundle.store(gzip.compress(t, compresslevel=1, mtime=0)) for t in layer_tars]
    env = [PATH_ENV, *config.get("Env", [])]
    config_doc = {"architecture": "amd64", "os": "linux",
                  "config": {**config, "Env": env},
                  "rootfs": {"type": "layers",
                             "diff_ids": ["sha256:" + hashlib.sha256(t).hexdigest() for t in layer_tars]}}
    config_blob = bundle.store(json.dumps(config_doc, sort_keys=True).encode())
    manifest_body = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_blob},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer} for layer in layers]},
        sort_keys=True).encode()
    manifest = bundle.store(manifest_body)
    parsed = parse_image(ref)
    return Artifact("image", ref, parsed.mirror_repository, parsed.tag, manifest["digest"], OCI_MANIFEST,
                    [{**manifest, "media_type": OCI_MANIFEST}], [config_blob, *layers])


# kube-proxy programs the node's iptables (nft backend, as Debian's own iptables does);
# the links are what update-alternatives makes on install.
KUBE_PROXY_PACKAGES = ["iptables"]
KUBE_PROXY_LINKS = {f"/usr/sbin/{tool}": "xtables-nft-multi"
                    for tool in ("iptables", "iptables-save", "iptables-restore",
                                 "ip6tables", "ip6tables-save", "ip6tables-restore")}


def build_deb(work: Path, name: str, version: str, files: dict[str, tuple[bytes, int]], depends: str,
              description: str, fields: dict[str, str] | None = None) -> Path:
    root = work / name
    (root / "DEBIAN").mkdir(parents=True)
    for path, (data, mode) in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)
    control = (f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
               "Maintainer: gpuboot lab <lab@gpuboot.invalid>\n"
               + (f"Depends: {depends}\n" if depends else "")
               + "".join(f"{key}: {value}\n" for key, value in (fields or {}).items())
               + f"Description: {description}\n")
    (root / "DEBIAN" / "control").write_text(control)
    deb = work / f"{name}_{version}_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(deb)],
                   check=True, capture_output=True)
    return deb


def package_artifact(bundle: Bundle, os_id: str, name: str, version: str, deb: Path) -> Artifact:
    blob = bundle.store(deb.read_bytes())
    return Artifact("package", f"{os_id}: {name}={version}", f"packages/{os_id}", deb.name, blob["digest"],
                    DEB, [], [blob])


def containerd_io_unbuildable(release: matrix.Release) -> str | None:
    """Why the lab cannot build the release's containerd.io, or None when it can."""
    lab_build = (release.model_extra or {}).get("lab_build") or {}
    missing = [name for name in ("containerd", "runc") if name not in lab_build]
    return f"release {release.name} names no lab_build.{' and lab_build.'.join(missing)} to build it from" if missing else None


def containerd_io(builder: KubernetesBuild, version: str, lab_build: dict, package_version: str) -> Deb:
    """The containerd.io package of the lab's nodes, from the containerd and runc companions."""
    built = builder.build_companions(version, ("containerd", "runc"))
    containerd, runc = built["containerd"], built["runc"] / "runc"
    files = {f"usr/bin/{name}": ((containerd / name).read_bytes(), 0o755)
             for name in ("containerd", "ctr", "containerd-shim-runc-v2")}
    files["usr/bin/runc"] = (runc.read_bytes(), 0o755)
    files["usr/lib/systemd/system/containerd.service"] = (CONTAINERD_UNIT.encode(), 0o644)
    return Deb("containerd.io", package_version, files, "libseccomp2",
            f"containerd {lab_build['containerd']['version']} with runc {lab_build['runc']['version']} "
            "(gpuboot lab build)", CONTAINERD_IO_FIELDS)


def write(version: str | None, out: Path, log: Callable[[str], None] = print) -> LabBundle:
    builder = KubernetesBuild(log=log)
    result = builder.build(version)
    version = result.version
    release = matrix.load(matrix_versions()[version])
    bin_dir = result.bin_dir
    images_list = subprocess.run([str(bin_dir / "kubeadm"), "config", "images", "list", "--kubernetes-version",
                                  version], capture_output=True, text=True, check=True).stdout.split()
    bundle = Bundle(out)
    artifacts: list[Artifact] = []
    not_built: list[str] = []
    lab_build = release.model_extra.get("lab_build", {})
    for ref in images_list:
        short = parse_image(ref).repository.rsplit("/", 1)[-1]
        if short not in IMAGE_BINARIES:
            not_built.append(f"{ref} (not on this machine's Go module proxy at that version)")
            continue
        path_in_image, entrypoint = IMAGE_BINARIES[short]
        companions: dict[str, bytes] = {}
        if short in lab_build:  # etcd, coredns: built at the matrix's lab_build version
            binary = builder.companion_dir(version, short) / short
            companions = {command: (binary.parent / command).read_bytes() for command in COMPANION_COMMANDS.get(short, {})}
            if parse_image(ref).tag != lab_build[short]["image_tag"]:
                raise LabError(f"kubeadm wants {ref} but lab_build.{short}.image_tag is "
                               f"{lab_build[short]['image_tag']}",
                               hint=f"fix lab_build in mirror/releases/{release.name}.yml")
        else:
            binary = bin_dir / short
        log(f"image {ref}")
        base = (rootfs_tar(KUBE_PROXY_PACKAGES, builder.cache_dir / "debroot", KUBE_PROXY_LINKS)
                if short == "kube-proxy" else None)
        artifacts.append(image_artifact(bundle, ref, path_in_image, binary.read_bytes(), entrypoint, base, companions))
    # validate's probe image: agnhost built from k8s.io/kubernetes at this version, under the
    # name the matrix gives it (its own version number may differ from that tag).
    for ref in (release.images or {}).get("validate") or []:
        if parse_image(ref).repository.endswith("/agnhost"):
            log(f"image {ref}")
            artifacts.append(image_artifact(bundle, ref, "agnhost", (bin_dir / "agnhost").read_bytes(), ["/agnhost"]))
    os_id = "debian-12"
    kube = release.os[os_id].kube_packages
    cni_version = str(kube.model_extra["kubernetes_cni"])
    # As upstream's packages: kubeadm wants a kubelet and kubectl no older than the skew policy
    # allows (three minors), so kubeadm installs first in kubeadm's upgrade order.
    major, minor_ = version.lstrip("v").split(".")[:2]
    minimum = f"{major}.{max(0, int(minor_) - 3)}.0"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cni_dir = builder.companion_dir(version, "cni_plugins")
        debs = [
            Deb("kubernetes-cni", cni_version, {f"opt/cni/bin/{p.name}": (p.read_bytes(), 0o755)
                                             for p in sorted(cni_dir.iterdir())}, "",
             f"CNI plugins {lab_build['cni_plugins']['version']} (gpuboot lab build)"),
            Deb("kubectl", kube.version, {"usr/bin/kubectl": ((bin_dir / "kubectl").read_bytes(), 0o755)}, "",
             f"kubectl {version} (gpuboot lab build)"),
            Deb("kubelet", kube.version, {"usr/bin/kubelet": ((bin_dir / "kubelet").read_bytes(), 0o755),
                                       "usr/lib/systemd/system/kubelet.service": (KUBELET_UNIT.encode(), 0o644),
                                       "usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf":
                                           (KUBEADM_DROP_IN.encode(), 0o644)},
             "kubernetes-cni, iptables, mount", f"kubelet {version} (gpuboot lab build)"),
            # (Upstream's kubelet and kubectl floors are far below its own version.)
            Deb("kubeadm", kube.version, {"usr/bin/kubeadm": ((bin_dir / "kubeadm").read_bytes(), 0o755)},
             f"kubelet (>= {minimum}), kubectl (>= {minimum}), kubernetes-cni"
             + (", cri-tools" if "cri_tools" in lab_build else ""),
             f"kubeadm {version} (gpuboot lab build)"),
        ]
        if "cri_tools" in lab_build:
            crictl = builder.companion_dir(version, "cri_tools") / "crictl"
            debs.insert(0, Deb("cri-tools", str(kube.model_extra["cri_tools"]), {"usr/bin/crictl": (crictl.read_bytes(), 0o755)},
                               "", f"crictl {lab_build['cri_tools']['version']} (gpuboot lab build)"))
        runtime = release.os[os_id].containerd
        unbuildable = containerd_io_unbuildable(release)
        if runtime["package"] == "containerd.io" and unbuildable:
            not_built.append(f"containerd.io={runtime['version']} ({unbuildable})")
        elif runtime["package"] == "containerd.io":
            debs.insert(0, containerd_io(builder, version, lab_build, str(runtime["version"])))
        packages = []
        for name, pkg_version, files, depends, description, fields in debs:
            log(f"package {name}={pkg_version}")
            deb = build_deb(work, name, pkg_version, files, depends, description, fields)
            artifacts.append(package_artifact(bundle, os_id, name, pkg_version, deb))
            packages.append(f"{name}={pkg_version}")
    if "cri_tools" not in lab_build:
        not_built.append(f"cri-tools={kube.model_extra['cri_tools']} (release {release.name} names no "
                         "lab_build.cri_tools to build crictl from)")
    bundle.write_manifest(f"{release.name}-lab", artifacts)
    return LabBundle(out, [a.ref for a in artifacts if a.kind == "image"], packages, not_built)


def runtime_repository(release_name: str, out: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """A flat apt repository holding the release's containerd.io for Debian 12, built as the
    lab's bundle builds it, for nodes that have no lab mirror (molecule's, the shared test lab's):
    `deb [trusted=yes] file:OUT ./`. Rebuilt only when the package is not there yet."""
    release = matrix.load(release_name)
    out = out or RUNTIME_REPOSITORIES / release_name
    runtime = release.os["debian-12"].containerd
    lab_build = (release.model_extra or {}).get("lab_build") or {}
    unbuildable = ("its debian-12 containerd is not containerd.io" if runtime["package"] != "containerd.io"
                   else containerd_io_unbuildable(release))
    if unbuildable:
        raise LabError(f"release {release_name} has no containerd.io the lab can build: {unbuildable}",
                       hint=f"name lab_build.containerd and lab_build.runc in mirror/releases/{release_name}.yml")
    deb_name = f"containerd.io_{runtime['version']}_amd64.deb"
    build_once(out, f"apt repository {out}", lambda: (out / deb_name).is_file() and (out / "Packages").is_file(),
               lambda: _runtime_repository(release, out, deb_name, lab_build, str(runtime["version"]), log), log)
    return out


def _runtime_repository(release: matrix.Release, out: Path, deb_name: str, lab_build: dict, version: str,
                        log: Callable[[str], None]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        deb = build_deb(Path(tmp), *containerd_io(KubernetesBuild(log=log), release.kubernetes.version, lab_build,
                                                  version))
        shutil.copyfile(deb, out / f"{deb_name}.partial")
        (out / f"{deb_name}.partial").replace(out / deb_name)
    write_index(out)
    log(f"apt repository {out}: containerd.io={version}")
