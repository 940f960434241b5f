"""NVIDIA's operators built from their sources at the lab release's versions (issue 29, point 1):
`gpuboot lab operators bundle` builds the GPU Operator from its repository's vendored tree and
Node Feature Discovery from its module, and writes each as an image under the name the release
gives it, carrying the files the upstream Dockerfile copies. The binaries report the pinned
version. Skipped, naming what to bring, where the GPU Operator's source tree is absent."""
from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import tarfile

import pytest

from gpuboot import matrix
from gpuboot.mirror.bundle import Bundle
from gpuboot_lab import LAB_RELEASE
from gpuboot_lab.operators import OPERATORS, OperatorBuild, image_ref, images, source_version
from gpuboot_lab.upstream import SOURCE_ROOT, source_git_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    for spec in OPERATORS:
        trees = ([spec.origin] if spec.kind == "tree" else []) + [repository for _, repository, _ in spec.from_trees]
        for tree in trees:
            if source_git_dir(tree, SOURCE_ROOT) is None:
                pytest.skip(f"{tree}'s source tree is not on this machine: git clone --bare "
                            f"https://github.com/{tree} {SOURCE_ROOT}/{tree.replace('/', '+')}/repo")
    release = matrix.load(LAB_RELEASE)
    bundle = Bundle(tmp_path_factory.mktemp("operators"))
    build = OperatorBuild(log=print)
    return release, bundle, build, {a.ref: a for a in images(bundle, release, build)}


def layer_files(bundle: Bundle, artifact) -> dict[str, int]:
    """path -> mode of every file in the image's own (top) layer."""
    manifest = json.loads(bundle.blob_path(artifact.digest).read_bytes())
    top = manifest["layers"][-1]["digest"]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(bundle.blob_path(top).read_bytes()))) as tar:
        return {member.name: member.mode for member in tar.getmembers() if member.isfile()}


def test_each_operator_image_is_built_under_the_releases_name(built):
    release, bundle, _, artifacts = built
    assert sorted(artifacts) == sorted(image_ref(release, spec) for spec in OPERATORS)


def test_the_gpu_operator_image_carries_its_binaries_and_operand_manifests(built):
    release, bundle, build, artifacts = built
    spec = next(s for s in OPERATORS if s.key == "operator")
    files = layer_files(bundle, artifacts[image_ref(release, spec)])
    for binary in ("usr/bin/gpu-operator", "usr/bin/manage-crds", "usr/bin/cleanup-gpuclusters"):
        assert files.get(binary) == 0o755, binary
    # What the operator reads at run time: each operand's state and the NVIDIADriver manifests.
    for path in ("opt/gpu-operator/state-driver/0500_daemonset.yaml",
                 "opt/gpu-operator/state-device-plugin/0500_daemonset.yaml",
                 "opt/gpu-operator/manifests/state-driver/0500_daemonset.yaml",
                 "opt/gpu-operator/nvidia.com_clusterpolicies.yaml"):
        assert path in files, path


def test_nfd_reports_the_pinned_version(built):
    release, _, build, _ = built
    spec = next(s for s in OPERATORS if s.key == "nfd")
    version = source_version(release, spec)
    master = build.bin_dir(spec, version) / "nfd-master"
    proc = subprocess.run([str(master), "-version"], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, NODE_NAME="lab"))
    assert version in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_network_operators_nfd_is_upstreams_nearest_release_under_the_charts_name(built):
    release, _, build, artifacts = built
    spec = next(s for s in OPERATORS if s.component == "network_operator" and s.key == "nfd")
    assert image_ref(release, spec) in artifacts
    master = build.bin_dir(spec, source_version(release, spec)) / "nfd-master"
    proc = subprocess.run([str(master), "-version"], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, NODE_NAME="lab"))
    assert spec.source_version in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_init_container_is_built_with_the_dependency_the_proxy_refuses(built):
    release, bundle, build, artifacts = built
    spec = next(s for s in OPERATORS if s.key == "initContainer")
    files = layer_files(bundle, artifacts[image_ref(release, spec)])
    assert files.get("network-operator-init-container") == 0o755, files
    binary = build.bin_dir(spec, source_version(release, spec)) / "network-operator-init-container"
    proc = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30)
    assert "--configmap-name" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
