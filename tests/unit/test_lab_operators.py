"""The operators the lab builds from source: each is an image every release of the matrix names,
built at that image's tag, with the version its own release build stamps."""
from __future__ import annotations

import io
import re
import subprocess
import tarfile

import pytest

from gpuboot import matrix
from gpuboot_lab.errors import LabError
from gpuboot_lab.operators import (
    KUBE_VIP,
    LOCAL_REPLACE,
    MULTUS_BIN,
    OPERATORS,
    SECONDARY_NETWORKS,
    SRIOV_CNIS,
    SRIOV_OPERATOR,
    OperatorBuild,
    _layer,
    image_ref,
    source_version,
)


@pytest.mark.parametrize("release", matrix.available())
def test_every_release_names_each_operator_image_the_lab_builds(release):
    loaded = matrix.load(release)
    for spec in (*OPERATORS, SRIOV_OPERATOR, *SRIOV_CNIS, *SECONDARY_NETWORKS, KUBE_VIP):
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


def test_a_fork_without_the_releases_tag_is_built_from_its_release_branch_and_says_so(tmp_path):
    work = tmp_path / "work"
    work.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q", "-b", "main")
    git("commit", "-q", "--allow-empty", "-m", "one")
    git("tag", "network-operator-v26.4.0-beta.7")
    git("branch", "network-operator-26.4.x")
    head = git("rev-parse", "HEAD")
    sources = tmp_path / "sources"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(sources / "Mellanox+sriov-network-operator" / "repo")],
                   check=True)
    build = OperatorBuild(cache_dir=tmp_path / "cache", log=lambda _: None, sources=sources)
    revision, what = build.revision(SRIOV_OPERATOR, "network-operator-v26.4.1")
    assert revision == head and what.startswith("branch network-operator-26.4.x at ")
    assert "(network-operator-v26.4.0-beta.7)" in what and "the tag network-operator-v26.4.1 is not in the stored tree" in what
    assert build.revision(SRIOV_OPERATOR, "network-operator-v26.4.0-beta.7") == (
        "network-operator-v26.4.0-beta.7", "tag network-operator-v26.4.0-beta.7")
    with pytest.raises(LabError, match="neither the tag network-operator-v27.1.0 nor the branch network-operator-27.1.x"):
        build.revision(SRIOV_OPERATOR, "network-operator-v27.1.0")
    # A spec without a release branch is built at its version as it is.
    assert build.revision(KUBE_VIP, "v1.2.3") == ("v1.2.3", "v1.2.3")


def test_an_images_layer_holds_its_applets_as_links_to_busybox():
    layer = _layer([("entrypoint.sh", b"#!/bin/sh\n", 0o755)], (("bin/awk", "busybox"),), ("var/log",))
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["entrypoint.sh"].mode == 0o755 and members["bin/awk"].issym()
    assert members["var/log"].isdir()
    assert members["bin/awk"].linkname == "busybox"
    # The CNI plugins' entrypoint scripts run their image's applets: each links them.
    for spec in SRIOV_CNIS:
        assert spec.entrypoint == ("/entrypoint.sh",) and {"awk", "cp"} <= set(spec.applets)


def test_nv_ipams_node_daemon_finds_its_cni_log_folder():
    """ipam-node refuses to start when its --cni-log-file's folder (/var/log) is missing, which
    the upstream image's distroless base has."""
    nv_ipam = next(spec for spec in SECONDARY_NETWORKS if spec.key == "nvIpam")
    assert "var/log" in nv_ipam.folders


def test_multus_is_where_the_policys_daemonset_runs_it_and_its_installer_copies_from():
    """The NicClusterPolicy's DaemonSet runs /install_multus --type thin, which copies multus and
    passthru from /usr/src/multus-cni/bin, then /thin_entrypoint."""
    multus = next(spec for spec in SECONDARY_NETWORKS if spec.key == "multus")
    built = {multus.image_path(name) for name, _ in multus.binaries}
    assert {f"{MULTUS_BIN}/multus", f"{MULTUS_BIN}/passthru"} <= built
    for command in ("install_multus", "thin_entrypoint"):
        target = dict(multus.links)[command]
        assert target.lstrip("/") in built, (command, target)


def test_the_cni_plugins_entrypoint_copies_every_plugin_by_rename_and_stays(tmp_path):
    """The policy's DaemonSet runs the image's entrypoint with the node's CNI folder at
    /host/opt/cni/bin: every plugin lands there whole (a running plugin's file is replaced, not
    rewritten), and the container stays."""
    plugins = next(spec for spec in SECONDARY_NETWORKS if spec.key == "cniPlugins")
    assert {"macvlan", "host-local", "ipvlan"} <= {name for name, _ in plugins.binaries}
    shell, flag, script = plugins.entrypoint
    assert (shell, flag) == ("/bin/sh", "-c") and set(plugins.applets) >= {"cp", "mv", "sleep"}
    source, host = tmp_path / "src", tmp_path / "host"
    source.mkdir()
    host.mkdir()
    for name in ("macvlan", "host-local"):
        (source / name).write_text(f"new {name}")
    (host / "macvlan").write_text("old")
    local = (script.replace(f"/{plugins.bin_path}", str(source)).replace("/host/opt/cni/bin", str(host))
             .replace("while :; do sleep 3600; done", "exit 0"))
    done = subprocess.run(["sh", "-c", local], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_text() for p in host.iterdir()} == {"macvlan": "new macvlan", "host-local": "new host-local"}
