"""A connected site's pull-through cache for real, on the session lab: a mirror host beside the
nodes gets its caches from the `mirror` phase (the OS's docker-registry in proxy mode, TLS from
gpuboot's CA, one user), the nodes get hosts.toml from `container_runtime`, and containerd on
the nodes fetches through them.

The "upstream" stands for registry.k8s.io: a registry on the lab's gateway that every cache is
pointed at with `mirror.cache_remotes` (distribution starts a cache only while its remote
answers, and the fenced lab reaches no real registry; that also proves a fetch that works went
through the cache). With the
upstream stopped, what the cache holds is still fetched and only what it lacks fails, with
an error that names the image."""
from __future__ import annotations

import json
import subprocess
import time
from ipaddress import ip_network
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.mirror.serve import ServeSpec, start
from gpuboot_lab.cluster import container_name
from tests.integration.conftest import edit_inventory, ssh
from tests.support.mirror_fixture import IMAGE_CACHE, free_port
from tests.support.oci_layout import busybox_binaries, push, write_layout
from tests.support.run_events import events_of

pytestmark = pytest.mark.lab

MIRROR = "mirror1"
MIRROR_HOST = 190  # the subnet's hosts from .190: clear of the nodes and of the executors (.200)
CACHED = "registry.k8s.io/lab/pause:3.10.2"
NEVER_PULLED = "registry.k8s.io/lab/never-pulled:1"
ROLE = Path(__file__).resolve().parents[2] / "roles" / "registry_mirror"
# Where the role keeps its caches, read from the role (its default root, its vars' cache root).
CACHE_ROOT = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["registry_mirror_cache_root"].replace(
    "{{ registry_mirror_root }}", yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["registry_mirror_root"])


@pytest.fixture(scope="module")
def site(lab, tmp_path_factory):
    work = tmp_path_factory.mktemp("connected")
    state = lab["state"]
    hosts = list(ip_network(state.spec.subnet).hosts())
    gateway, address = str(hosts[0]), str(hosts[MIRROR_HOST])
    upstream = start(ServeSpec(work / "upstream", f"{gateway}:{free_port()}", tls=False))
    container = container_name(state.spec.name, MIRROR)
    try:
        binaries = busybox_binaries(IMAGE_CACHE)
        for tag, ref in (("cached", CACHED), ("never", NEVER_PULLED)):
            layout = work / f"layout-{tag}"
            write_layout(layout, tag, binaries, tag)
            push(layout, tag, f"{upstream.spec.listen}/{ref.split('/', 1)[1]}")
        secrets = work / "secrets"
        assert run(["mirror", "cert", "--dir", str(secrets), "--name", address]) == 0
        credentials = secrets / "mirror.json"
        credentials.write_text(json.dumps({"username": "puller", "password": "FAKE-CACHE-LAB-PASSWORD"}))
        credentials.chmod(0o600)
        known = lab["lab"].dir / "known_hosts"
        known.write_text(known.read_text() + lab["lab"].run_extra(MIRROR, address, []))

        def connected(data):
            data["all"]["children"]["mirror"] = {"hosts": {MIRROR: {"ansible_host": address}}}
            data["all"]["vars"]["gpuboot"]["mirror"] = {
                "air_gapped": False, "registry": f"{address}:5000",
                "ca_file": str(secrets / "ca.crt"), "credentials_file": str(credentials),
                "tls_cert_file": str(secrets / "server.crt"), "tls_key_file": str(secrets / "server.key"),
                # Every cache fetches from the lab's upstream: a cache starts only while its
                # remote answers, and the fenced lab reaches no real registry.
                "cache_remotes": {name: f"http://{upstream.spec.listen}"
                                  for name in matrix.load(data["all"]["vars"]["gpuboot"]["release"]).upstream_registries}}

        inventory = edit_inventory(lab["inventory"], work / "inventory.yml", connected)
        yield {"inventory": inventory, "upstream": upstream, "mirror": address, "container": container}
    finally:
        upstream.stop()
        subprocess.run(["podman", "rm", "-f", container], capture_output=True)
        # The session's later tests run with the lab's own inventory: no hosts.toml of this site.
        for host in state.addresses:
            ssh(lab, host, "rm -rf /etc/containerd/certs.d")


def fetch(lab, host: str, ref: str) -> subprocess.CompletedProcess[str]:
    """containerd's own resolver reading the hosts.toml files, as the CRI plugin does."""
    return ssh(lab, host, f"ctr -n cache-probe content fetch --hosts-dir /etc/containerd/certs.d "
                          f"--platform linux/amd64 {ref}")


def wait_stored(container: str, upstream: str, digests: list[str], within_s: float = 180) -> None:
    """Wait until the cache holds every blob on its own disk. distribution serves a first pull
    from the remote and stores the blob in the background with a second fetch, so "the client
    has it" comes before "the cache has it"; on a loaded machine, by seconds."""
    blobs = f"{CACHE_ROOT}/{upstream}/docker/registry/v2/blobs/sha256"
    paths = [f"{blobs}/{d.split(':', 1)[1][:2]}/{d.split(':', 1)[1]}/data" for d in digests]
    deadline = time.monotonic() + within_s
    while True:
        missing = [p for p in paths
                   if subprocess.run(["podman", "exec", container, "test", "-s", p]).returncode != 0]
        if not missing:
            return
        assert time.monotonic() < deadline, (f"the cache did not store {len(missing)} of the "
                                             f"{len(paths)} blobs it served within {within_s:.0f} s", missing)
        time.sleep(2)


def test_the_caches_run_the_nodes_ask_them_first_and_a_cached_image_outlives_its_upstream(lab, site, capsys):
    inventory = str(site["inventory"])
    assert run(["up", inventory, "--to", "container_runtime", "--output", "json"]) == 0, capsys.readouterr().out[-3000:]
    events = events_of(capsys.readouterr().out)
    assert [e["phase"] for e in events if e["event"] == "PhaseFinished"][:1] == ["mirror"]

    upstreams = ssh(lab, sorted(lab["state"].addresses)[0], "ls /etc/containerd/certs.d").stdout.split()
    assert "registry.k8s.io" in upstreams and "docker.io" in upstreams

    nodes = sorted(h for h in lab["state"].addresses if "-w" in h)
    first, second = nodes[0], nodes[1]
    through = fetch(lab, first, CACHED)
    assert through.returncode == 0, through.stdout + through.stderr

    fetched = ssh(lab, first, "ctr -n cache-probe content ls -q").stdout.split()
    assert len(fetched) >= 3, fetched  # the index, the amd64 manifest, its config and layer
    wait_stored(site["container"], CACHED.split("/", 1)[0], fetched)

    site["upstream"].stop()
    cached = fetch(lab, second, CACHED)
    assert cached.returncode == 0, ("the cache must serve what it fetched once, with the upstream gone",
                                    cached.stdout + cached.stderr)
    missing = fetch(lab, second, NEVER_PULLED)
    assert missing.returncode != 0
    assert NEVER_PULLED in missing.stderr, missing.stderr

    # Converged: the mirror host still shows every cache, and a second run changes nothing.
    assert run(["up", inventory, "--to", "container_runtime", "--output", "json"]) == 0
    events = events_of(capsys.readouterr().out)
    assert "mirror" in [e["phase"] for e in events if e["event"] == "PhaseSkipped"]
    assert [e["phase"] for e in events if e["event"] == "PhaseFinished"] == []
