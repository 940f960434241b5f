"""The operators the lab builds from source: each is an image every release of the matrix names,
built at that image's tag, with the version its own release build stamps."""
from __future__ import annotations

import re

import pytest

from gpuboot import matrix
from gpuboot_lab.errors import LabError
from gpuboot_lab.operators import KUBE_VIP, LOCAL_REPLACE, OPERATORS, image_ref, source_version


@pytest.mark.parametrize("release", matrix.available())
def test_every_release_names_each_operator_image_the_lab_builds(release):
    loaded = matrix.load(release)
    for spec in (*OPERATORS, KUBE_VIP):
        # The source is built at a version: the image's tag (the init container's repository
        # tags each Network Operator release network-operator-vX), or the one the spec names.
        version = source_version(loaded, spec)
        assert re.match(r"^(network-operator-)?v\d", version), \
            f"{release}: {spec.component}.{spec.key} is built at {version!r}, no version"


def test_the_version_is_stamped_as_the_projects_own_build_does():
    nfd = next(spec for spec in OPERATORS if spec.key == "nfd")
    assert "-X sigs.k8s.io/node-feature-discovery/pkg/version.version=v0.19.0" in nfd.ldflags("v0.19.0")
    assert "pkg/utils/hostpath.pathPrefix=/host-" in nfd.ldflags("v0.19.0")


def test_a_release_without_the_image_is_refused_naming_it():
    bare = matrix.load(matrix.available()[0]).model_copy(update={"images": {}})
    with pytest.raises(LabError, match=r"names no gpu_operator.operator image"):
        image_ref(bare, OPERATORS[0])


def test_the_local_replaces_of_a_go_mod_are_found_in_both_forms():
    go_mod = ("replace (\n\tk8s.io/api => k8s.io/api v0.35.3\n"
              "\tsigs.k8s.io/node-feature-discovery/api/nfd => ./api/nfd\n)\nreplace example.com/x => ./x\n")
    assert LOCAL_REPLACE.findall(go_mod) == ["sigs.k8s.io/node-feature-discovery/api/nfd", "example.com/x"]


def test_the_network_operators_binaries_sit_where_its_chart_runs_them():
    # deployment/network-operator runs /manager, and its hooks /keep-ncp and /apply-crds.
    spec = next(spec for spec in OPERATORS if spec.component == "network_operator")
    assert [spec.image_path(name) for name, _ in spec.binaries] == ["manager", "keep-ncp", "apply-crds"]
    assert spec.entrypoint == ("/manager",)
    gpu = next(spec for spec in OPERATORS if spec.key == "operator" and spec.component == "gpu_operator")
    assert gpu.image_path("gpu-operator") == "usr/bin/gpu-operator"


def test_kube_vip_is_built_as_its_own_image_is():
    # Its Dockerfile: the one static binary at /kube-vip, the entrypoint; its Makefile stamps main.Version.
    assert KUBE_VIP.image_path("kube-vip") == "kube-vip" and KUBE_VIP.entrypoint == ("/kube-vip",)
    assert "-X main.Version=v1.2.3" in KUBE_VIP.ldflags("v1.2.3")
    assert image_ref(matrix.load("k8s-1.36"), KUBE_VIP) == "ghcr.io/kube-vip/kube-vip:v1.2.3"
