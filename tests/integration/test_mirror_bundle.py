"""Bundle round trips between real registries on loopback (CNCF distribution, started by
the fixture; images pushed into the upstream with skopeo): pull, import over TLS with a
gpuboot CA and credentials, verify, and every way a bundle or a mirror can be wrong."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from gpuboot.cli.main import run
from gpuboot.mirror.bundle import Bundle
from gpuboot.mirror.registry import Registry
from gpuboot.mirror.serve import ServeSpec, start
from tests.support.mirror_fixture import free_port, start_upstream, write_release


@pytest.fixture(autouse=True)
def _registry_tools():
    """A missing tool skips these tests on a developer's machine and fails them where CI
    requires the lab (GPUBOOT_REQUIRE_LAB=1), as the lab fixtures do."""
    missing = [tool for tool in ("docker-registry", "skopeo") if shutil.which(tool) is None]
    if missing:
        reason = f"{' and '.join(missing)} missing: bootstrap/setup.sh installs them"
        if os.environ.get("GPUBOOT_REQUIRE_LAB") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def gpuboot(capsys, *args: str) -> tuple[int, str]:
    code = run(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    root = tmp_path_factory.mktemp("upstream")
    up = start_upstream(root)
    yield up
    up.registry.stop()


@pytest.fixture
def mirror(tmp_path):
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"username": "importer", "password": "S3cret-bundle-pw"}))
    creds.chmod(0o600)
    registry = start(ServeSpec(tmp_path / "mirror", f"127.0.0.1:{free_port()}", credentials_file=creds))
    yield {"registry": registry, "creds": creds, "ca": registry.ca_file, "listen": registry.spec.listen}
    registry.stop()


@pytest.fixture(scope="module")
def bundle(upstream, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "b"
    code = run(["mirror", "--releases-dir", str(upstream.releases_dir), "pull", "--release", upstream.release,
                "--out", str(out), *upstream.sources])
    assert code == 0
    return out


def _import(capsys, bundle_dir: Path, mirror: dict, *extra: str) -> tuple[int, str]:
    return gpuboot(capsys, "mirror", "import", str(bundle_dir), "--registry", mirror["listen"],
                   "--ca-file", str(mirror["ca"]), "--credentials-file", str(mirror["creds"]), *extra)


def _client(mirror: dict) -> Registry:
    data = json.loads(mirror["creds"].read_text())
    return Registry(f"https://{mirror['listen']}", ca_file=str(mirror["ca"]),
                    credentials=(data["username"], data["password"]))


def _copy(bundle_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(bundle_dir, target)
    return target


def test_bundle_stores_every_shared_layer_once_and_keeps_upstream_digests(upstream, bundle):
    _release, artifacts = Bundle(bundle).read_manifest()
    assert sorted(a.ref for a in artifacts) == sorted(upstream.images)
    every_blob = [b["digest"] for a in artifacts for b in a.blobs]
    # Three images x two platforms share the two busybox layers.
    assert len(every_blob) > len(set(every_blob))
    stored = {p.name for p in (bundle / "blobs" / "sha256").iterdir()}
    assert {d.split(":")[1] for d in every_blob} <= stored
    up = Registry(upstream.registry.spec.url)
    for artifact in artifacts:
        assert artifact.digest == up.manifest_digest(artifact.repository, artifact.tag)
        assert artifact.media_type == "application/vnd.oci.image.index.v1+json"
        assert len(artifact.manifests) == 3  # amd64, arm64, index


def test_import_then_verify_then_no_op_reimport(capsys, upstream, bundle, mirror):
    code, out = _import(capsys, bundle, mirror)
    assert code == 0, out
    assert "3 artifacts (0 already there)" in out and "mounted" in out
    client = _client(mirror)
    _release, artifacts = Bundle(bundle).read_manifest()
    for artifact in artifacts:  # the original names, under the upstream host, same digest
        assert client.manifest_digest(artifact.repository, artifact.tag) == artifact.digest
    code, out = gpuboot(capsys, "mirror", "--releases-dir", str(upstream.releases_dir), "verify", "--release",
                        upstream.release, "--registry", mirror["listen"], "--ca-file", str(mirror["ca"]),
                        "--credentials-file", str(mirror["creds"]))
    assert code == 0 and "holds all 3" in out, out
    code, out = _import(capsys, bundle, mirror)
    assert code == 0 and "(3 already there); 0 blobs uploaded" in out, out
    # The mirror's password is never printed nor written in clear by gpuboot (htpasswd holds a bcrypt hash).
    password = json.loads(mirror["creds"].read_text())["password"]
    assert password not in out
    written = [p for p in mirror["registry"].spec.root.rglob("*") if p.is_file() and "data" not in p.parts]
    assert written and all(password.encode() not in p.read_bytes() for p in written)


def test_corrupted_blob_fails_naming_the_artifact_and_tags_nothing(capsys, bundle, mirror, tmp_path):
    broken = _copy(bundle, tmp_path)
    _release, artifacts = Bundle(broken).read_manifest()
    victim = next(a for a in artifacts if "validator" in a.ref)
    shared = {b["digest"] for a in artifacts if a is not victim for b in a.blobs}
    own_layer = next(b for b in victim.blobs if b["digest"] not in shared)
    path = Bundle(broken).blob_path(own_layer["digest"])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    code, out = _import(capsys, broken, mirror)
    assert code == 6, out
    assert victim.ref in out and "corrupted" in out and "before any manifest was written" in out
    client = _client(mirror)
    assert all(client.manifest_digest(a.repository, a.tag) is None for a in artifacts)


def test_truncated_and_missing_blobs_fail_before_anything_is_sent(capsys, bundle, mirror, tmp_path):
    broken = _copy(bundle, tmp_path)
    _release, artifacts = Bundle(broken).read_manifest()
    driver = next(a for a in artifacts if "driver" in a.ref)
    pause = next(a for a in artifacts if "pause" in a.ref)
    big = max(driver.blobs, key=lambda b: b["size"])
    path = Bundle(broken).blob_path(big["digest"])
    path.write_bytes(path.read_bytes()[: big["size"] // 3])
    Bundle(broken).blob_path(pause.manifests[0]["digest"]).unlink()
    code, out = _import(capsys, broken, mirror)
    assert code == 6, out
    assert f"{driver.ref}: blob {big['digest']} is truncated" in out
    assert f"{pause.ref}: blob {pause.manifests[0]['digest']} is missing" in out
    assert "nothing was imported" in out
    assert not list((mirror["registry"].spec.root / "data").rglob("_manifests"))


def test_a_changed_bundle_manifest_is_refused(capsys, bundle, mirror, tmp_path):
    broken = _copy(bundle, tmp_path)
    manifest = broken / "bundle.json"
    manifest.write_text(manifest.read_text().replace("validator", "validat0r"))
    code, out = _import(capsys, broken, mirror)
    assert code == 6 and "does not match its checksum" in out, out


def test_wrong_ca_is_refused_with_the_fix(capsys, bundle, mirror, tmp_path):
    from gpuboot.mirror import pki
    other_ca, _key = pki.ensure_ca(tmp_path / "other-ca")
    code, out = gpuboot(capsys, "mirror", "import", str(bundle), "--registry", mirror["listen"],
                        "--ca-file", str(other_ca), "--credentials-file", str(mirror["creds"]))
    assert code == 6, out
    assert "TLS verification of registry" in out and str(other_ca) in out


def test_missing_credentials_are_asked_for(capsys, bundle, mirror):
    code, out = gpuboot(capsys, "mirror", "import", str(bundle), "--registry", mirror["listen"],
                        "--ca-file", str(mirror["ca"]))
    assert code == 6 and "asks for credentials" in out and "--credentials-file" in out, out


def test_verify_names_what_the_mirror_lacks(capsys, upstream, bundle, mirror, tmp_path):
    assert _import(capsys, bundle, mirror)[0] == 0
    releases = tmp_path / "releases"
    releases.mkdir()
    wanted = [*upstream.images, "nvcr.io/nvidia/lab/driver:570.158.01-ubuntu24.04"]
    write_release(releases / "lab-more.yml", "lab-more", wanted)
    code, out = gpuboot(capsys, "mirror", "--releases-dir", str(releases), "verify", "--release", "lab-more",
                        "--registry", mirror["listen"], "--ca-file", str(mirror["ca"]),
                        "--credentials-file", str(mirror["creds"]))
    assert code == 6, out
    assert "lacks 1 artifact" in out and "nvcr.io/nvidia/lab/driver:570.158.01-ubuntu24.04: not in the mirror" in out


def test_interrupted_pull_resumes_without_refetching_finished_blobs(capsys, upstream, bundle, tmp_path):
    partial_bundle = _copy(bundle, tmp_path)
    (partial_bundle / "bundle.json").unlink()  # as if the pull died before finishing
    _release, artifacts = Bundle(bundle).read_manifest()
    lost = sorted({b["digest"] for a in artifacts for b in a.blobs})[:2]
    for digest in lost:
        Bundle(partial_bundle).blob_path(digest).unlink()
    code, out = gpuboot(capsys, "mirror", "--releases-dir", str(upstream.releases_dir), "pull", "--release",
                        upstream.release, "--out", str(partial_bundle), *upstream.sources)
    assert code == 0, out
    fetched = int(out.split(" blobs fetched")[0].rsplit(";", 1)[1])
    assert fetched == len(lost), out  # only what was missing
    assert (partial_bundle / "bundle.json").read_bytes() == (bundle / "bundle.json").read_bytes()


def test_mirror_stopped_during_an_import_then_the_import_resumes_with_only_what_is_missing(capsys, bundle, mirror):
    """An import the mirror's stop cut short (blobs uploaded, two artifacts not tagged yet):
    while the mirror is down the import fails naming it; once it is back the import tags what
    is missing and uploads no blob again."""
    code, out = _import(capsys, bundle, mirror)
    assert code == 0, out
    registry = mirror["registry"]
    _release, artifacts = Bundle(bundle).read_manifest()
    repositories = registry.spec.root / "data" / "docker" / "registry" / "v2" / "repositories"
    untagged = artifacts[:2]
    registry.stop()
    for artifact in untagged:  # as the mirror's storage is when it stopped before these tags
        shutil.rmtree(repositories / artifact.repository / "_manifests")

    code, out = _import(capsys, bundle, mirror)
    assert code != 0 and f"registry {mirror['listen']} unreachable" in out and "registry is running" in out, out

    restarted = start(registry.spec)
    try:
        code, out = _import(capsys, bundle, mirror)
        assert code == 0, out
        assert f"{len(artifacts)} artifacts ({len(artifacts) - len(untagged)} already there); 0 blobs uploaded" in out, out
        client = _client(mirror)
        for artifact in artifacts:
            assert client.manifest_digest(artifact.repository, artifact.tag) == artifact.digest
    finally:
        restarted.stop()


def test_signed_bundle_verifies_and_a_foreign_signer_is_refused(capsys, upstream, tmp_path, mirror):
    key = tmp_path / "signer"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    out_dir = tmp_path / "signed"
    code, out = gpuboot(capsys, "mirror", "--releases-dir", str(upstream.releases_dir), "pull", "--release",
                        upstream.release, "--out", str(out_dir), "--sign-key", str(key), *upstream.sources)
    assert code == 0 and (out_dir / "bundle.json.sig").is_file(), out
    signers = tmp_path / "allowed"
    signers.write_text(f"gpuboot {key.with_suffix('.pub').read_text()}")
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    others = tmp_path / "others"
    others.write_text(f"gpuboot {stranger.with_suffix('.pub').read_text()}")
    code, out = _import(capsys, out_dir, mirror, "--allowed-signers", str(others))
    assert code == 6 and "does not verify" in out, out
    code, out = _import(capsys, out_dir, mirror, "--allowed-signers", str(signers))
    assert code == 0, out


def _chart_archive(name: str, version: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, text in ((f"{name}/Chart.yaml", f"apiVersion: v2\nname: {name}\nversion: {version}\n"),
                           (f"{name}/values.yaml", "replicas: 1\n"),
                           (f"{name}/templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")):
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buffer.getvalue(), mtime=0)


def test_chart_from_a_helm_repository_becomes_an_oci_chart_in_the_mirror(capsys, upstream, mirror, tmp_path):
    served = tmp_path / "helm-root"
    repo = served / "stable"
    repo.mkdir(parents=True)
    archive = _chart_archive("lab-operator", "1.2.3")
    (repo / "lab-operator-1.2.3.tgz").write_bytes(archive)
    (repo / "index.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "entries": {"lab-operator": [
        {"name": "lab-operator", "version": "1.2.3", "urls": ["lab-operator-1.2.3.tgz"],
         "digest": hashlib.sha256(archive).hexdigest()}]}}))
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        releases = tmp_path / "releases"
        releases.mkdir()
        write_release(releases / "lab-chart.yml", "lab-chart", list(upstream.images)[:1],
                      charts={"repository": "https://charts.example.invalid/stable", "name": "lab-operator",
                              "version": "1.2.3"})
        out_dir = tmp_path / "bundle"
        code, out = gpuboot(capsys, "mirror", "--releases-dir", str(releases), "pull", "--release", "lab-chart",
                            "--out", str(out_dir), *upstream.sources,
                            f"--source=charts.example.invalid=http://127.0.0.1:{server.server_port}")
        assert code == 0, out
        assert _import(capsys, out_dir, mirror)[0] == 0
    finally:
        server.shutdown()
    client = _client(mirror)
    manifest = client.manifest("charts/lab-operator", "1.2.3").document()
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    assert manifest["layers"][0]["digest"] == "sha256:" + hashlib.sha256(archive).hexdigest()
    config = b"".join(client.blob_chunks("charts/lab-operator", manifest["config"]["digest"]))
    assert json.loads(config)["name"] == "lab-operator"


def test_up_refuses_to_start_image_pulling_phases_while_the_mirror_lacks_artifacts(capsys, bundle, mirror, tmp_path,
                                                                                  monkeypatch):
    assert _import(capsys, bundle, mirror)[0] == 0  # a mirror with some images, not the release's
    sample = Path(__file__).resolve().parents[2] / "inventories" / "sample"
    data = yaml.safe_load((sample / "inventory.yml").read_text())
    settings = yaml.safe_load((sample / "group_vars" / "all.yml").read_text())["gpuboot"]
    settings["ssh"] = {"user": "ops"}
    settings.pop("gitops")
    settings["mirror"] = {"air_gapped": True, "registry": mirror["listen"], "ca_file": str(mirror["ca"]),
                          "credentials_file": str(mirror["creds"])}
    data["all"]["vars"]["gpuboot"] = settings
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(tmp_path / "state"))
    code, out = gpuboot(capsys, "up", str(inventory), "--only", "gpu_operator")
    assert code == 6, out
    assert "lacks" in out and "nvcr.io/nvidia/driver:580-5.15.0-1032-nvidia-ubuntu22.04: not in the mirror" in out
    assert "gpuboot mirror import" in out
    assert not (tmp_path / "state").exists() or not list((tmp_path / "state").rglob("runs/*"))  # no host touched
    # Node preparation pulls no images: the check does not stand in its way.
    from gpuboot.config.loader import load_cluster
    from gpuboot.mirror.preflight import needed
    from gpuboot.phases.catalog import UP
    cluster = load_cluster(inventory)
    assert not needed(cluster, [p for p in UP if p.name in ("preflight", "os_prep", "container_runtime")])
    assert needed(cluster, [p for p in UP if p.name == "control_plane_init"])


def test_pull_names_every_planned_package_missing_from_the_download_dir(tmp_path):
    import sys

    from gpuboot.errors import MirrorError
    from gpuboot.mirror.packages import collect
    from gpuboot.mirror.plan import PlannedPackage
    standin = Path(__file__).resolve().parents[2] / "tests" / "doubles" / "kube_packages" / "standin_repo.py"
    os_dir = tmp_path / "debs" / "debian-12"
    subprocess.run([sys.executable, str(standin), "1.35.4-1.1", str(os_dir)], check=True, capture_output=True)
    wanted = [PlannedPackage("debian-12", "kubeadm", "1.35.4-1.1", ""),
              PlannedPackage("debian-12", "kubelet", "1.35.4-1.2", ""),
              PlannedPackage("debian-12", "containerd", "1.6.20~ds1-1+deb12u3", "")]
    with pytest.raises(MirrorError) as err:
        collect(tmp_path / "debs", wanted)
    text = str(err.value)
    assert "2 planned package(s)" in text and "kubelet=1.35.4-1.2" in text and "containerd=1.6.20" in text
    assert "kubeadm" not in text.split("\n", 1)[1].split("fix:")[0]
    found = collect(tmp_path / "debs", wanted[:1])
    assert {f.name for f in found} == {"kubeadm", "kubelet", "kubectl", "cri-tools", "kubernetes-cni"}
