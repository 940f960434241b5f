"""A real lab for integration tests: systemd containers with sshd, made by `gpuboot lab`.

Session-scoped and torn down at the end. Without podman the lab tests are skipped,
unless GPUBOOT_REQUIRE_LAB=1 (CI sets it), where a missing lab is a failure."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from contextlib import contextmanager
from ipaddress import ip_network
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot_lab import LAB_RELEASE
from gpuboot_lab import artifacts as lab_artifacts
from gpuboot_lab.cluster import Lab, LabSpec
from gpuboot_lab.errors import LabError
from gpuboot_lab.kubernetes import KubernetesBuild, matrix_versions
from tests.support.apiserver import ETCD, ApiServer

# .ci/run runs the suite in lanes, one pytest each (tests/bench/lanes.py); every lane has its own
# shared lab. A module's own lab has a name and subnet no other module uses (a unit test checks).
LANE_ENV = "GPUBOOT_TEST_LANE"


def _lane() -> int:
    value = os.environ.get(LANE_ENV, "0")
    if not value.isdigit() or int(value) > 8:
        raise pytest.UsageError(f"{LANE_ENV}={value!r}: a lane is a number from 0 to 8")
    return int(value)


LANE = _lane()
LAB_NAME = "itest" if LANE == 0 else f"itest{LANE}"
LAB_SUBNET = f"10.213.{9 + LANE}.0/24"  # 10.213.9.0/24 to 10.213.17.0/24: no module's own


def _lab_possible() -> str | None:
    missing = [tool for tool in ("podman", "mmdebstrap", "nft", "apt-cacher-ng") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        return "the lab needs root"
    return f"missing: {', '.join(missing)}" if missing else None


@pytest.fixture(scope="session")
def lab_required():
    """Skips (fails in CI, GPUBOOT_REQUIRE_LAB=1) where the lab cannot run: for tests that bring
    up labs of their own and need nothing of the shared one."""
    reason = _lab_possible()
    if reason:
        if os.environ.get("GPUBOOT_REQUIRE_LAB") == "1":
            pytest.fail(f"lab required but not possible here: {reason}")
        pytest.skip(f"no lab: {reason}")


@pytest.fixture(scope="session")
def lab(lab_required, tmp_path_factory):
    """The shared lab (one per lane of .ci/run): plain nodes with the release's containerd.io."""
    root = tmp_path_factory.mktemp("lab")
    lab = Lab(root / "_lab" / LAB_NAME, log=lambda msg: None)
    lab.down(LAB_NAME)  # a crashed earlier session may have left one behind
    inventory = root / "inventory" / "inventory.yml"
    try:
        state = lab.up(LabSpec(name=LAB_NAME, subnet=LAB_SUBNET), inventory)
        info = {"lab": lab, "state": state, "inventory": inventory, "root": root}
        runtime_packages_on_nodes(info)
        yield info
    finally:
        lab.down(LAB_NAME)


@contextmanager
def containerd_node(tmp_path: Path, name: str, subnet: str):
    """A one-node lab of the containerd flavour (privileged, own /var/lib/containerd),
    removed again at the end; yields the same shape as the `lab` fixture."""
    node_lab = Lab(tmp_path / "_lab", log=lambda msg: None)
    node_lab.down(name)
    inventory = tmp_path / "lab" / "inventory.yml"
    state = node_lab.up(LabSpec(name=name, control_planes=1, workers=0, gpu_workers=0, subnet=subnet,
                                flavour="containerd"), inventory)
    try:
        yield {"lab": node_lab, "state": state, "inventory": inventory}
    finally:
        node_lab.down(name)


RUNTIME_REPO_ON_NODE = "/srv/gpuboot-lab-runtime"


def runtime_packages_on_nodes(lab_info, release: str = LAB_RELEASE) -> None:
    """Every node of a lab without the lab mirror gets the release's containerd.io (containerd 2
    and runc built from Go modules, packaged as the lab bundle packages them) in a local apt
    repository, as a site's package mirror offers it: Debian's own archive has no containerd 2."""
    repo = lab_artifacts.runtime_repository(release, log=lambda m: None)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(repo.iterdir()):
            archive.add(path, arcname=path.name)
    for host in lab_info["state"].addresses:
        placed = ssh(lab_info, host, f"mkdir -p {RUNTIME_REPO_ON_NODE} && tar -x -C {RUNTIME_REPO_ON_NODE} && "
                                     f"echo 'deb [trusted=yes] file:{RUNTIME_REPO_ON_NODE} ./' "
                                     "> /etc/apt/sources.list.d/gpuboot-lab-runtime.list", stdin=buffer.getvalue())
        assert placed.returncode == 0, (host, placed.stderr)


def ssh(lab_info, host: str, command: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command on a lab node over real SSH, with host-key checking on."""
    state = lab_info["state"]
    key = lab_info["lab"].dir / "id_ed25519"
    known = lab_info["lab"].dir / "known_hosts"
    argv = ["ssh", "-i", str(key), "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", f"root@{state.addresses[host]}", command]
    if stdin is not None:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=120)
        return subprocess.CompletedProcess(argv, done.returncode, done.stdout.decode(errors="replace"),
                                           done.stderr.decode(errors="replace"))
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def built_kubectl(version: str) -> Path:
    """The kubectl of the lab's Kubernetes build at `version`: built here when CI requires the
    lab, else the test is skipped with the command that builds it."""
    builder = KubernetesBuild(log=lambda m: None)
    try:
        return builder.path(version) / "kubectl"
    except LabError as exc:
        if os.environ.get("GPUBOOT_REQUIRE_LAB") != "1":
            pytest.skip(f"SKIPPED the real cluster: {exc.message}; {exc.hint}")
        return builder.build(version).bin_dir / "kubectl"


@contextmanager
def kubernetes_lab(tmp_path: Path, spec: LabSpec):
    """A kubernetes-flavour lab and its air-gapped mirror exactly as the README's main job makes
    them (`gpuboot lab up --flavour kubernetes`, `gpuboot lab mirror BUNDLE`), with gpuboot's
    state under tmp_path/state. Yields what the tests read; the lab is taken down after."""
    version = matrix.load(spec.release).kubernetes.version
    kubectl = built_kubectl(version)
    bundle = tmp_path / "bundle"
    made = lab_artifacts.write(version, bundle, log=lambda m: None)
    # crictl is built (cri-tools, which the lab's kubeadm depends on as upstream's does).
    assert any(p.startswith("cri-tools=") for p in made.packages), made.packages
    assert not any("cri-tools" in entry for entry in made.not_built), made.not_built
    node_lab = Lab(tmp_path / "state" / "_lab" / spec.name, log=lambda msg: None)
    node_lab.down(spec.name)
    inventory = tmp_path / "lab" / "inventory.yml"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GPUBOOT_STATE_DIR", str(tmp_path / "state"))
        try:
            node_lab.up(spec, inventory)
            state = node_lab.start_mirror(bundle)
            mirror = yaml.safe_load(inventory.read_text())["all"]["vars"]["gpuboot"]["mirror"]
            assert mirror["air_gapped"] and mirror["registry"].startswith(str(next(ip_network(spec.subnet).hosts())))
            yield {"lab": node_lab, "state": state, "inventory": inventory, "version": version, "kubectl": kubectl,
                   "mirror": mirror["registry"], "packages": mirror["packages_url"].removeprefix("https://"),
                   "kubeconfig": tmp_path / "state" / spec.name / "admin.conf", "tmp": tmp_path}
        finally:
            node_lab.down(spec.name)
            assert not subprocess.run(["pgrep", "-f", f"docker-registry serve {node_lab.dir}"]).returncode == 0, \
                "lab down left the lab mirror's registry running"


def lab_kubectl(info, *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """kubectl of the lab's build against a `kubernetes_lab` cluster, through its kubeconfig (the VIP)."""
    return subprocess.run([str(info["kubectl"]), "--kubeconfig", str(info["kubeconfig"]),
                           f"--request-timeout={int(timeout)}s", *args],
                          capture_output=True, text=True, timeout=timeout + 5)


def edit_inventory(src: Path, dest: Path, change) -> Path:
    data = yaml.safe_load(src.read_text())
    change(data)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


@pytest.fixture(scope="session")
def api(tmp_path_factory):
    """A real API server (etcd + kube-apiserver of the matrix's newest Kubernetes, built from
    Go modules) on loopback, for API-level tests; one per session, so tests keep to their own
    namespaces and apply (not create) what others may have made."""
    missing = [tool for tool in ("go", ETCD) if shutil.which(tool) is None]
    if missing:
        if os.environ.get("GPUBOOT_REQUIRE_LAB") == "1":
            pytest.fail(f"missing {missing}: bootstrap/setup.sh installs etcd-server and stops naming how to "
                        "install Go when it is missing or too old")
        pytest.skip(f"missing {missing}")
    newest = sorted(matrix_versions(), key=lambda v: tuple(int(p) for p in v.lstrip("v").split(".")))[-1]
    built = KubernetesBuild(log=lambda m: None).build(newest)
    server = ApiServer(tmp_path_factory.mktemp("api"), built.bin_dir).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def helm():
    """The real helm, built from its Go module (gpuboot lab helm build; cached)."""
    from gpuboot_lab.helm import HelmBuild
    return HelmBuild(log=lambda m: None).build()
