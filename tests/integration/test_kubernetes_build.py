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
