"""The mirror plan: complete by construction, including the images the operators only
resolve at run time, and loud when an input it needs is missing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.errors import InventoryError, MatrixError, MirrorError
from gpuboot.mirror.plan import NodeTarget, Target, build
from gpuboot.mirror.refs import parse_image

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "inventories" / "sample" / "inventory.yml"


def refs(plan) -> set[str]:
    return {str(i.ref) for i in plan.images}


def test_sample_plan_lists_the_runtime_resolved_driver_images():
    cluster = load_cluster(SAMPLE)
    release = matrix.load(cluster.settings.release)
    plan = build(release, Target.of(cluster, release))
    gpu = release.model_extra["gpu_operator"]
    doca = release.model_extra["network_operator"]["doca_driver_version"]
    # Each GPU node's own kernel (gpuboot_node.kernel), precompiled as gpuboot.drivers asks:
    # no driver built on a node, so no generic driver image and no kernel headers; the DOCA
    # driver too (forcePrecompiled), so no DOCA image without a kernel in its tag.
    expected = set()
    for node in ("gpu01", "gpu02"):
        kernel = cluster.host_inputs(node)["gpuboot_node"]["kernel"]
        expected.add(f"nvcr.io/nvidia/driver:{gpu['driver_branch']}-{kernel}-ubuntu22.04")
        expected.add(f"nvcr.io/nvidia/mellanox/doca-driver:{doca}-{kernel}-ubuntu22.04-amd64")
    resolved = [i for i in plan.images if i.why.startswith("resolved at run time")]
    assert {str(i.ref) for i in resolved} == expected
    packages = {str(p) for p in plan.packages}
    assert not [p for p in packages if "linux-headers" in p]
    assert f"ubuntu-22.04: kubeadm={release.os['ubuntu-22.04'].kube_packages.version}" in packages
    # Calico's CRDs are a chart of their own from v3.32, planned with its operator's.
    assert {c.name for c in plan.charts} == {"crd.projectcalico.org.v1", "tigera-operator", "gpu-operator",
                                            "network-operator", "argo-cd"}
    assert {c.component for c in plan.charts if c.name.startswith(("crd.projectcalico", "tigera"))} == {"calico"}


def test_container_drivers_plan_the_generic_image_and_headers_per_kernel():
    release = matrix.load("k8s-1.36")
    nodes = (NodeTarget("ubuntu-22.04", "ubuntu22.04", ("5.15.0-127-generic",), gpu_driver="container"),
             NodeTarget("ubuntu-22.04", "ubuntu22.04", ("5.15.0-130-generic",), gpu_driver="container"),
             NodeTarget("ubuntu-24.04", "ubuntu24.04", ("6.8.0-52-generic",), gpu_driver="preinstalled"))
    plan = build(release, Target(nodes))
    version = release.model_extra["gpu_operator"]["driver_version"]
    assert [r for r in refs(plan) if r.startswith("nvcr.io/nvidia/driver:")] == [f"nvcr.io/nvidia/driver:{version}-ubuntu22.04"]
    headers = sorted(str(p) for p in plan.packages if "headers" in p.name)
    assert headers == ["ubuntu-22.04: linux-headers-5.15.0-127-generic", "ubuntu-22.04: linux-headers-5.15.0-130-generic"]
    assert any("ubuntu-24.04 use the driver installed on the host" in note for note in plan.notes)


@pytest.mark.parametrize("release_name", matrix.available())
def test_kubernetes_images_are_kubeadms_list_for_the_version(release_name):
    release = matrix.load(release_name)
    images = [parse_image(text) for text in release.images["kubernetes"]]
    version = release.kubernetes.version
    for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        assert f"registry.k8s.io/{component}:{version}" in {str(i) for i in images}
    assert release.kubernetes.model_extra["pause_image"] in {str(i) for i in images}
    assert {i.repository for i in images} >= {"etcd", "coredns/coredns", "pause"}
    # Every image names a registry the nodes' hosts.toml sends to the mirror.
    upstream = set(release.upstream_registries)
    nodes = tuple(NodeTarget(key, release.os_for(key if not entry.os_minor_in_tag else key + ".6")[2],
                             ("6.8.0-31-generic",), ("amd64", "arm64"), kind, True, True)
                  for key, entry in release.os.items() for kind in ("container", "precompiled"))
    plan = build(release, Target(nodes))
    assert {i.ref.registry for i in plan.images} <= upstream


def test_architectures_and_kernels_multiply_the_doca_images():
    release = matrix.load("k8s-1.36")
    nodes = tuple(NodeTarget("ubuntu-24.04", "ubuntu24.04", (kernel,), ("amd64", "arm64"), rdma=True, precompiled=True)
                  for kernel in ("6.8.0-31-generic", "6.8.0-49-generic"))
    plan = build(release, Target(nodes))
    doca = [r for r in refs(plan) if "doca-driver" in r]
    assert len(doca) == 2 * 2  # precompiled: per kernel and arch
    built = build(release, Target((NodeTarget("ubuntu-24.04", "ubuntu24.04", ("6.8.0-31-generic",), ("amd64", "arm64"),
                                              rdma=True, precompiled=False),)))
    assert sorted(r.rsplit("-", 1)[1] for r in refs(built) if "doca-driver" in r) == ["amd64", "arm64"]  # per arch
    without = build(release, Target((NodeTarget("ubuntu-24.04", "ubuntu24.04", ("6.8.0-31-generic",)),)))
    assert not [r for r in refs(without) if "doca-driver" in r]


def test_os_minor_reaches_the_driver_tag():
    release = matrix.load("k8s-1.36")
    assert release.os_for("rhel-9.4")[::2] == ("rhel-9", "rhel9.4")
    assert release.os_for("ubuntu-22.04")[2] == "ubuntu22.04"
    with pytest.raises(MatrixError, match="tagged per minor release"):
        release.os_for("rhel-9")


def _inventory(tmp_path: Path, **gpuboot_extra) -> Path:
    data = yaml.safe_load(SAMPLE.read_text())
    settings = yaml.safe_load((SAMPLE.parent / "group_vars" / "all.yml").read_text())["gpuboot"]
    settings.update(gpuboot_extra)
    for key, value in list(settings.items()):
        if value is None:
            del settings[key]
    data["all"]["vars"]["gpuboot"] = settings
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_gpu_cluster_without_node_os_cannot_be_planned(tmp_path):
    cluster = load_cluster(_inventory(tmp_path, node_os=None, drivers=None))
    with pytest.raises(MirrorError) as err:
        Target.of(cluster, matrix.load(cluster.settings.release))
    assert "the OS of gpu01, gpu02 is not known" in err.value.message and "kernels" in err.value.hint


def test_node_os_must_be_in_the_release_and_precompiled_needs_kernels(tmp_path):
    path = _inventory(tmp_path, node_os={"id": "sles-15", "kernels": []}, drivers={"precompiled": True})
    with pytest.raises(InventoryError) as err:
        load_cluster(path)
    text = str(err.value)
    assert "gpuboot.node_os.id: sles-15 is not supported by release k8s-1.36" in text
    # (a precompiled driver without a known kernel: tests/corpus/malformed/precompiled_kernel_unknown.yml)


@pytest.mark.parametrize("text, message", [
    ("nvidia/driver:1", "does not name its registry"),
    ("nvcr.io/nvidia/driver", "has no tag"),
    ("nvcr.io/nvidia/driver:1@sha256:abc", "not a sha256 digest"),
    ("nvcr.io/NVIDIA/driver:1", "not a valid reference"),
])
def test_bad_image_references_are_rejected_with_the_fix(text, message):
    with pytest.raises(MirrorError) as err:
        parse_image(text)
    assert message in err.value.message and err.value.hint


def test_pinned_reference_keeps_its_digest():
    digest = "sha256:" + "ab" * 32
    ref = parse_image(f"registry.k8s.io/pause:3.10.1@{digest}")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == ("registry.k8s.io", "pause", "3.10.1", digest)


def test_unknown_placeholder_in_a_runtime_image_is_an_error(tmp_path):
    text = (ROOT / "mirror" / "releases" / "k8s-1.36.yml").read_text()
    text = text.replace("{gpu_operator.driver_version}", "{gpu_operator.driver_versoin}")
    (tmp_path / "k8s-1.36.yml").write_text(text)
    release = matrix.load("k8s-1.36", tmp_path)
    with pytest.raises(MirrorError) as err:
        build(release, Target((NodeTarget("ubuntu-22.04", "ubuntu22.04", gpu_driver="container"),)))
    assert "gpu_operator.driver_versoin" in err.value.message


def test_mirror_plan_cli_counts_and_reports_unpinned(capsys):
    assert run(["mirror", "plan", str(SAMPLE), "--output", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    summary = data["summary"]
    assert summary["total"] == len(data["artifacts"]) == summary["images"] + summary["charts"] + summary["packages"]
    assert len(summary["unpinned"]) == summary["images"] + summary["charts"]  # no digests pinned yet
    assert any(a["ref"].startswith("nvcr.io/nvidia/driver:580-5.15.0-1032-nvidia") for a in data["artifacts"])
    assert run(["mirror", "plan", str(SAMPLE), "--release", "k8s-1.36"]) == 2
