"""The lab's Argo CD build recipe (gpuboot_lab.argocd): the wrapper module keeps upstream's
replace block and points each of upstream's nested modules (gitops-engine from v3.3, which the
module proxy neither serves nor keeps in argo-cd's zip) at a directory taken from the
repository's tree at the tag."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuboot_lab import argocd
from gpuboot_lab.errors import LabError

UPSTREAM = """module github.com/argoproj/argo-cd/v3

go 1.26.0

require (
\tgithub.com/argoproj/argo-cd/gitops-engine v0.7.1-0.20250908182407-97ad5b59a627
)

replace (
\tk8s.io/api => k8s.io/api v0.34.0
)

replace github.com/argoproj/argo-cd/gitops-engine => ./gitops-engine
"""


def test_a_nested_module_is_replaced_by_its_extracted_directory(tmp_path):
    assert argocd.local_replaces(UPSTREAM) == [("github.com/argoproj/argo-cd/gitops-engine", "gitops-engine")]
    go_mod = argocd.wrapper_go_mod("v3.4.4", UPSTREAM, {"github.com/argoproj/argo-cd/gitops-engine":
                                                        tmp_path / "gitops-engine"})
    assert "require github.com/argoproj/argo-cd/v3 v3.4.4" in go_mod
    assert "\tk8s.io/api => k8s.io/api v0.34.0" in go_mod
    assert f"replace github.com/argoproj/argo-cd/gitops-engine => {tmp_path / 'gitops-engine'}" in go_mod
    assert "=> ./" not in go_mod  # a relative path would point into the wrapper


def test_a_release_without_nested_modules_needs_no_source_tree():
    plain = UPSTREAM.split("replace github.com/argoproj/argo-cd/gitops-engine")[0]
    assert argocd.local_replaces(plain) == []
    assert "gitops-engine =>" not in argocd.wrapper_go_mod("v3.0.11", plain)


def _repository(root: Path, tag: str) -> None:
    work = root / "work"
    (work / "gitops-engine").mkdir(parents=True)
    (work / "gitops-engine" / "go.mod").write_text("module github.com/argoproj/argo-cd/gitops-engine\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(work)]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    subprocess.run([*git, "tag", tag], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / "argoproj+argo-cd" / "repo")], check=True)


def test_nested_modules_come_from_the_tree_at_the_tag(tmp_path):
    _repository(tmp_path, "v3.4.4")
    found = argocd.extract_nested("v3.4.4", ["gitops-engine"], tmp_path / "out", root=tmp_path)
    assert (found["gitops-engine"] / "go.mod").read_text().startswith("module github.com/argoproj/argo-cd/gitops-engine")
    with pytest.raises(LabError, match="no gitops-engine at v9.9.9"):
        argocd.extract_nested("v9.9.9", ["gitops-engine"], tmp_path / "out2", root=tmp_path)


def test_a_missing_source_tree_says_how_to_bring_it(tmp_path):
    with pytest.raises(LabError) as raised:
        argocd.extract_nested("v3.4.4", ["gitops-engine"], tmp_path / "out", root=tmp_path / "none")
    assert "github:argoproj/argo-cd" in raised.value.hint
