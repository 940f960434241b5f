#!/usr/bin/env python3
"""A TEST DOUBLE for the Kubernetes package repository: stand-in .debs named kubeadm,
kubelet, kubectl, cri-tools and kubernetes-cni at the matrix's version, in a flat apt
repository, until the lab builds the real packages from Go modules.

Each stand-in has the real package's name, version, dependencies and the files the
kube_packages role and its checks look at: /usr/bin/<tool> answering `version` like the real
one, and for kubelet the systemd unit and its kubeadm drop-in. Built with dpkg-deb on the node.

usage: standin_repo.py VERSION OUT_DIR [CRI_TOOLS_VERSION KUBERNETES_CNI_VERSION]
       (VERSION like 1.35.4-1.1; the companions default to <minor>.0-1.1)"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile

KUBELET_UNIT = """[Unit]
Description=kubelet (gpuboot stand-in package)
[Service]
ExecStart=/usr/bin/kubelet
Restart=always
RestartSec=10
[Install]
WantedBy=multi-user.target
"""


def tool(name: str, upstream: str) -> str:
    # Answers like the real binaries: `kubeadm version -o short`, `kubelet --version`, `kubectl version --client`.
    return f"""#!/bin/sh
# gpuboot stand-in for {name} v{upstream}: a test double, not Kubernetes.
case "$*" in
  *version*) echo "{name} v{upstream} (gpuboot stand-in)"; exit 0 ;;
esac
echo "{name}: gpuboot stand-in package, it does nothing" >&2
exit 1
"""


PACKAGES = {
    "cri-tools": ({"usr/bin/crictl": "crictl"}, ""),
    "kubernetes-cni": ({}, ""),
    "kubectl": ({"usr/bin/kubectl": "kubectl"}, ""),
    "kubelet": ({"usr/bin/kubelet": "kubelet"}, "kubernetes-cni"),
    "kubeadm": ({"usr/bin/kubeadm": "kubeadm"}, "kubelet (>= 1.30.0), kubectl (>= 1.30.0), cri-tools (>= 1.30.0)"),
}


def build(version: str, out: str, cri_tools: str | None = None, cni: str | None = None) -> None:
    upstream = version.split("-")[0]
    os.makedirs(out, exist_ok=True)
    stanzas = []
    for name, (files, depends) in PACKAGES.items():
        minor = ".".join(upstream.split(".")[:2])
        companion = {"cri-tools": cri_tools, "kubernetes-cni": cni}.get(name)
        pkg_version = version if name in ("kubeadm", "kubelet", "kubectl") else companion or f"{minor}.0-1.1"
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "DEBIAN"))
            for path, binary in files.items():
                os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
                with open(os.path.join(root, path), "w") as handle:
                    handle.write(tool(binary, upstream))
                os.chmod(os.path.join(root, path), 0o755)
            if name == "kubelet":
                unit_dir = os.path.join(root, "usr/lib/systemd/system")
                os.makedirs(unit_dir + "/kubelet.service.d")
                with open(unit_dir + "/kubelet.service", "w") as handle:
                    handle.write(KUBELET_UNIT)
                with open(unit_dir + "/kubelet.service.d/10-kubeadm.conf", "w") as handle:
                    handle.write("[Service]\nEnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env\n")
            control = (f"Package: {name}\nVersion: {pkg_version}\nArchitecture: amd64\n"
                       f"Maintainer: gpuboot tests <tests@gpuboot.invalid>\n"
                       + (f"Depends: {depends}\n" if depends else "")
                       + f"Description: gpuboot stand-in for {name} (test double)\n")
            with open(os.path.join(root, "DEBIAN", "control"), "w") as handle:
                handle.write(control)
            deb = f"{name}_{pkg_version}_amd64.deb"
            subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, os.path.join(out, deb)],
                           check=True, capture_output=True)
        data = open(os.path.join(out, deb), "rb").read()
        stanzas.append(control + f"Filename: ./{deb}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n")
    with open(os.path.join(out, "Packages"), "w") as handle:
        handle.write("\n".join(stanzas))


if __name__ == "__main__":
    build(*sys.argv[1:5])
