"""The wrapper-module recipe that builds k8s.io/kubernetes commands from the Go module proxy."""
from __future__ import annotations

import pytest

from gpuboot_lab import kubernetes as kb
from gpuboot_lab.errors import LabError

# The shape of k8s.io/kubernetes's go.mod: staging modules required at v0.0.0 and replaced
# with ./staging paths, plus go and godebug lines.
UPSTREAM = """module k8s.io/kubernetes

go 1.25.0

godebug default=go1.25

require (
\tgithub.com/spf13/cobra v1.10.0
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/kube-proxy => ./staging/src/k8s.io/kube-proxy
)
"""


def test_wrapper_requires_the_release_and_pins_each_staging_module():
    go_mod = kb.wrapper_go_mod("v1.35.4", UPSTREAM)
    lines = [line.strip() for line in go_mod.splitlines()]
    assert "require k8s.io/kubernetes v1.35.4" in lines
    assert "go 1.25.0" in lines and "godebug default=go1.25" in lines
    replaced = [line for line in lines if "=>" in line]
    assert replaced == ["k8s.io/api => k8s.io/api v0.35.4", "k8s.io/client-go => k8s.io/client-go v0.35.4",
                        "k8s.io/kube-proxy => k8s.io/kube-proxy v0.35.4"]
    assert "github.com/spf13/cobra" not in go_mod  # upstream's own requirements come through the module


def test_a_go_mod_without_staging_replacements_is_refused():
    with pytest.raises(LabError, match="no ./staging replacements"):
        kb.wrapper_go_mod("v1.35.4", "module k8s.io/kubernetes\n\ngo 1.25.0\n")


def test_version_ldflags_set_both_version_packages():
    flags = kb.ldflags("v1.34.4", "2026-04-15T18:01:22Z")
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        for value in ("gitVersion=v1.34.4", "gitMajor=1", "gitMinor=34", "gitTreeState=clean",
                      "buildDate=2026-04-15T18:01:22Z"):
            assert f"-X {package}.{value}" in flags


def test_versions_come_from_the_matrix():
    assert kb.resolve_version("1.35.4") == "v1.35.4"
    assert kb.resolve_version(None) == max(kb.matrix_versions(), key=lambda v: [int(p) for p in v[1:].split(".")])
    with pytest.raises(LabError, match="not in the version matrix") as info:
        kb.resolve_version("v1.20.0")
    assert "v1.36.3" in str(info.value.hint) and "v1.37.2" in str(info.value.hint)


def test_the_cache_key_changes_with_the_recipe(tmp_path, monkeypatch):
    build = kb.KubernetesBuild(cache_dir=tmp_path, log=lambda m: None)
    before = build.build_dir("v1.35.4")
    monkeypatch.setattr(kb, "RECIPE_VERSION", "test-other")
    assert build.build_dir("v1.35.4") != before
    assert before.parent == tmp_path / "builds" and before.name.startswith("v1.35.4-")


def test_path_names_the_build_command_when_nothing_is_built(tmp_path):
    with pytest.raises(LabError) as info:
        kb.KubernetesBuild(cache_dir=tmp_path, log=lambda m: None).path("v1.36.3")
    assert "gpuboot lab kubernetes build --version v1.36.3" in str(info.value.hint)
