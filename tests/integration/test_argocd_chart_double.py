"""The argo-cd chart TEST DOUBLE is as strict as the real chart where gpuboot depends on it: its
values schema is closed (a key gpuboot misspells fails helm, as it would be ignored or refused
by the real one), and its objects are Argo CD's own install manifests of the matrix's version,
with the images and namespace the values and release give (real helm from its Go module)."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from gpuboot import matrix
from gpuboot_lab.helm import HelmBuild
from tests.support.argocd_chart import package

RELEASE = matrix.entry("k8s-1.36")
REDIS = next(ref for ref in RELEASE["images"]["argocd"] if "/redis:" in ref)
VALUES = {"global": {"image": {"repository": "quay.io/argoproj/argocd", "tag": RELEASE["argocd"]["version"]}},
          "redis": {"image": dict(zip(("repository", "tag"), REDIS.split(":"), strict=True))},
          "dex": {"enabled": False},
          "configs": {"ssh": {"knownHosts": "[10.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIdouble\n"}}}


@pytest.fixture(scope="module")
def chart(tmp_path_factory):
    helm = HelmBuild(log=lambda m: None).build()
    out = tmp_path_factory.mktemp("argo-cd")
    archive = out / "argo-cd.tgz"
    archive.write_bytes(package(helm, RELEASE["argocd"]["version"], str(RELEASE["argocd"]["chart"]["version"]), out))
    return helm, archive


def template(chart, values: dict) -> subprocess.CompletedProcess[str]:
    helm, archive = chart
    return subprocess.run([str(helm), "template", "argocd", str(archive), "--namespace", "platform-gitops",
                           "--include-crds", "--values", "-"], input=yaml.safe_dump(values),
                          capture_output=True, text=True, timeout=120)


def test_the_double_renders_argo_cds_own_objects_from_the_values(chart):
    done = template(chart, VALUES)
    assert done.returncode == 0, done.stderr
    objects = [o for o in yaml.safe_load_all(done.stdout) if o]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for wanted in [("StatefulSet", "argocd-application-controller"), ("Deployment", "argocd-repo-server"),
                   ("Deployment", "argocd-server"), ("Deployment", "argocd-redis"),
                   ("CustomResourceDefinition", "applications.argoproj.io")]:
        assert wanted in kinds
    assert not [name for _, name in kinds if "dex" in name]
    images = {c["image"] for o in objects if o["kind"] in ("Deployment", "StatefulSet")
              for c in o["spec"]["template"]["spec"]["containers"] + o["spec"]["template"]["spec"].get("initContainers", [])}
    assert images == set(RELEASE["images"]["argocd"])
    # Every namespaced object lands in the release's namespace, and the bindings name it.
    namespaced = [o for o in objects if o["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"platform-gitops"}
    assert {s["namespace"] for o in objects if o["kind"] == "ClusterRoleBinding" for s in o["subjects"]} == {"platform-gitops"}
    known = next(o for o in objects if o["metadata"]["name"] == "argocd-ssh-known-hosts-cm")
    assert known["data"]["ssh_known_hosts"] == VALUES["configs"]["ssh"]["knownHosts"]


@pytest.mark.parametrize("change, words", [
    (lambda v: v["dex"].update(enabled=True), "dex"),
    (lambda v: v["configs"]["ssh"].update(knownHost="x"), "knownHost"),
    (lambda v: v["configs"]["ssh"].update(knownHosts="not a host key"), "knownHosts"),
    (lambda v: v["global"]["image"].update(tag="latest"), "tag"),
])
def test_the_double_refuses_values_the_real_chart_would_not_honour(chart, change, words):
    values = yaml.safe_load(yaml.safe_dump(VALUES))
    change(values)
    done = template(chart, values)
    assert done.returncode != 0 and words in done.stderr, done.stderr[-800:]

