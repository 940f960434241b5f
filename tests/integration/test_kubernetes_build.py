"""Real Kubernetes binaries built from Go modules (`gpuboot lab kubernetes build`): cached on
this machine by version and recipe, so a CI run after the first reuses them (about 5 min cold,
under 30 s warm, about 1.5 s when nothing changed). Checks the binaries report the matrix's
version and that the matrix agrees with the real kubeadm about the sandbox image."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from gpuboot import matrix
from gpuboot_lab.kubernetes import COMPONENTS, KubernetesBuild, matrix_versions

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="module", params=sorted(matrix_versions()))
def built(request):
    if shutil.which("go") is None:
        if os.environ.get("GPUBOOT_REQUIRE_LAB") == "1":
            pytest.fail("go is missing: the Kubernetes build is required here")
        pytest.skip("go is missing")
    result = KubernetesBuild(log=lambda m: None).build(request.param)
    return result


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def test_every_binary_reports_the_matrix_version(built):
    version = built.version
    assert run(str(built.bin_dir / "kubeadm"), "version", "-o", "short") == version
    assert run(str(built.bin_dir / "kubelet"), "--version") == f"Kubernetes {version}"
    assert run(str(built.bin_dir / "kubectl"), "version", "--client").splitlines()[0] == f"Client Version: {version}"
    for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        assert run(str(built.bin_dir / component), "--version") == f"Kubernetes {version}", component
    assert {c for c in COMPONENTS} <= {p.name for p in built.bin_dir.iterdir()}


def test_the_matrix_pins_the_sandbox_image_kubeadm_expects(built):
    images = run(str(built.bin_dir / "kubeadm"), "config", "images", "list",
                 "--kubernetes-version", built.version).splitlines()
    release = matrix.load(matrix_versions()[built.version])
    pause = release.kubernetes.model_extra["pause_image"]
    assert pause in images, images
    assert run(str(built.bin_dir / "pause"), "-v") == f"pause.go version {pause.rsplit(':', 1)[1]}"


def test_the_mirror_plans_exactly_kubeadms_image_list(built):
    from gpuboot.mirror.plan import build
    images = run(str(built.bin_dir / "kubeadm"), "config", "images", "list",
                 "--kubernetes-version", built.version).splitlines()
    plan = build(matrix.load(matrix_versions()[built.version]))
    planned = [str(i.ref) for i in plan.images if i.component == "kubernetes"]
    assert planned == images  # same images, same order: a new kubeadm default fails here


def test_companions_are_built_at_the_matrix_lab_build_versions(built):
    release = matrix.load(matrix_versions()[built.version])
    lab_build = release.model_extra["lab_build"]
    builder = KubernetesBuild(log=lambda m: None)
    etcd = builder.companion_dir(built.version, "etcd") / "etcd"
    assert f"etcd Version: {lab_build['etcd']['version'].lstrip('v')}" in run(str(etcd), "--version")
    # kubeadm's etcd tag is what the lab image is named; its version part is what kubeadm wants.
    images = run(str(built.bin_dir / "kubeadm"), "config", "images", "list", "--kubernetes-version", built.version)
    assert f"registry.k8s.io/etcd:{lab_build['etcd']['image_tag']}" in images.splitlines()
    coredns = builder.companion_dir(built.version, "coredns") / "coredns"
    assert run(str(coredns), "-version").startswith(f"CoreDNS-{lab_build['coredns']['version'].lstrip('v')}")
    assert f"registry.k8s.io/coredns/coredns:{lab_build['coredns']['image_tag']}" in images.splitlines()
    cni = builder.companion_dir(built.version, "cni_plugins")
    assert {"bridge", "host-local", "loopback", "portmap"} <= {p.name for p in cni.iterdir()}
    answer = subprocess.run([str(cni / "bridge")], capture_output=True, text=True, env={"CNI_COMMAND": "VERSION"})
    assert "1.0.0" in json.loads(answer.stdout)["supportedVersions"]
    # crictl, which the lab packages as cri-tools, reports the lab_build version it was built at.
    crictl = builder.companion_dir(built.version, "cri_tools") / "crictl"
    assert run(str(crictl), "--version").strip() == f"crictl version {lab_build['cri_tools']['version']}"
    # containerd 2 and runc, which the lab packages as containerd.io, at their lab_build versions.
    if "containerd" in lab_build:
        containerd = builder.companion_dir(built.version, "containerd")
        assert run(str(containerd / "containerd"), "--version").split()[2] == lab_build["containerd"]["version"]
        assert run(str(containerd / "ctr"), "--version").split()[-1] == lab_build["containerd"]["version"]
        runc = builder.companion_dir(built.version, "runc") / "runc"
        said = run(str(runc), "--version").splitlines()
        assert said[0] == f"runc version {lab_build['runc']['version'].lstrip('v')}"
        # Built with libseccomp: RuntimeDefault pods (Calico's, Argo CD's) need its filter.
        assert any(line.startswith("libseccomp: ") for line in said), said


def test_containerd_io_stands_in_for_debians_containerd_and_runc(built, tmp_path):
    from gpuboot_lab.artifacts import build_deb, containerd_io
    release = matrix.load(matrix_versions()[built.version])
    runtime = release.os["debian-12"].containerd
    lab_build = release.model_extra["lab_build"]
    if runtime["package"] != "containerd.io":
        pytest.skip(f"{release.name} runs Debian's own containerd on debian-12")
    deb = build_deb(tmp_path, *containerd_io(KubernetesBuild(log=lambda m: None), built.version, lab_build,
                                             str(runtime["version"])))
    fields = dict(line.split(": ", 1) for line in run("dpkg-deb", "-f", str(deb)).splitlines() if ": " in line)
    assert (fields["Package"], fields["Version"]) == ("containerd.io", runtime["version"])
    for relation in ("Provides", "Conflicts", "Replaces"):
        assert {p.strip() for p in fields[relation].split(",")} == {"containerd", "runc"}, relation
    assert fields["Depends"] == "libseccomp2"
    listed = run("dpkg-deb", "-c", str(deb))
    for path in ("./usr/bin/containerd", "./usr/bin/ctr", "./usr/bin/containerd-shim-runc-v2", "./usr/bin/runc",
                 "./usr/lib/systemd/system/containerd.service"):
        assert path in listed, path
    # The matrix's Debian package is the release's containerd: what the CDI decision reads.
    assert str(runtime["version"]).startswith(release.containerd.version + "-")
