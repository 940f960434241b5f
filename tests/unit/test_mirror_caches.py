"""A connected site's pull-through caches (mirror.registry set, air_gapped false): one cache per
upstream on the mirror host at a port that never moves, each node's hosts.toml asking the cache
first and the upstream after, plan saying which registry goes through which cache, and located
errors for a remote no cache has and for ports the caches cannot take."""
from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.mirror.caches import caches

TESTS = Path(__file__).resolve().parents[1]
FLEET = TESTS / "fixtures" / "mixed-fleet"
UPSTREAMS = ["registry.k8s.io", "nvcr.io", "docker.io"]


def test_one_cache_per_upstream_after_the_mirrors_port():
    found = caches("mirror01.site:5000", False, UPSTREAMS, {"nvcr.io": "https://proxy.site/nvcr"})
    assert [(c.upstream, c.endpoint, c.server, c.remote) for c in found] == [
        ("registry.k8s.io", "mirror01.site:5001", "https://registry.k8s.io", "https://registry.k8s.io"),
        ("nvcr.io", "mirror01.site:5002", "https://nvcr.io", "https://proxy.site/nvcr"),
        # containerd's own endpoint for docker.io: the name images carry has no registry behind it.
        ("docker.io", "mirror01.site:5003", "https://registry-1.docker.io", "https://registry-1.docker.io")]
    assert [c.port for c in caches("mirror01.site", False, UPSTREAMS)] == [444, 445, 446]


@pytest.mark.parametrize(("registry", "air_gapped"), [(None, False), ("mirror01.site:5000", True)])
def test_no_caches_in_an_air_gap_or_without_a_mirror(registry, air_gapped):
    assert caches(registry, air_gapped, UPSTREAMS) == []


@pytest.mark.parametrize("name", matrix.available())
def test_a_release_only_appends_upstreams_so_a_cache_keeps_its_port_across_an_upgrade(name):
    release = matrix.load(name)
    assert release.upstream_registries, f"{name} names no upstream registries"
    for older in release.upgrades_from:
        before = matrix.load(older).upstream_registries
        assert release.upstream_registries[:len(before)] == before, (
            f"{name} reorders or drops {older}'s upstream_registries: a cache would change port in the upgrade")


def connected_site(tmp_path: Path, mirror: str) -> Path:
    """The mixed fleet with a mirror host, connected (no air gap), in the operator's own files."""
    root = tmp_path / "site"
    shutil.copytree(FLEET, root)
    ini = root / "hosts.ini"
    ini.write_text(ini.read_text() + "\n[mirror]\nmirror01 ansible_host=10.30.0.9\n")
    (root / "group_vars" / "all.yml").write_text(
        (root / "group_vars" / "all.yml").read_text().replace("gpuboot:\n", "gpuboot:\n" + mirror, 1))
    return ini


CONNECTED = "  mirror:\n    registry: mirror01.fleet.example:5000\n"


def test_each_upstream_asks_its_cache_first_and_itself_after(tmp_path):
    ini = connected_site(tmp_path, CONNECTED)
    out = tmp_path / "render"
    assert run(["render", str(ini), "--phase", "container_runtime", "--out", str(out)]) == 0
    upstreams = matrix.load("k8s-1.36").upstream_registries
    certs = out / "hgx01" / "etc" / "containerd" / "certs.d"
    assert sorted(p.name for p in certs.iterdir()) == sorted(upstreams)
    for index, upstream in enumerate(upstreams):
        hosts = tomllib.loads((certs / upstream / "hosts.toml").read_text())
        server = "https://registry-1.docker.io" if upstream == "docker.io" else f"https://{upstream}"
        cache = f"https://mirror01.fleet.example:{5001 + index}"
        assert hosts["server"] == server
        assert list(hosts["host"]) == [cache]
        # The cache serves at its root (no /v2/<upstream> path), only for pulls.
        assert hosts["host"][cache] == {"capabilities": ["pull", "resolve"]}


def test_the_mirror_host_runs_one_cache_per_upstream(tmp_path):
    ini = connected_site(tmp_path, CONNECTED)
    out = tmp_path / "render"
    assert run(["render", str(ini), "--phase", "mirror", "--out", str(out)]) == 0
    unit = (out / "mirror01" / "etc" / "systemd" / "system" / "gpuboot-registry-cache@.service").read_text()
    assert "ExecStart=/usr/bin/docker-registry serve /etc/docker/registry/cache-%i.yml" in unit
    assert "User=docker-registry" in unit


def test_an_air_gapped_site_runs_no_cache(tmp_path):
    ini = connected_site(tmp_path, CONNECTED + "    air_gapped: true\n")
    out = tmp_path / "render"
    assert run(["render", str(ini), "--phase", "mirror", "--out", str(out)]) == 0
    assert not (out / "mirror01" / "etc" / "systemd").exists()


def test_plan_says_which_registry_goes_through_which_cache(tmp_path, capsys):
    ini = connected_site(tmp_path, CONNECTED + "    cache_remotes: {nvcr.io: 'https://harbor.fleet.example/v2/nvcr'}\n")
    assert run(["--state-dir", str(tmp_path / "state"), "plan", str(ini), "--only", "mirror", "--output", "json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["phase"] == "mirror"
    assert row["notes"][:2] == [
        "pulls of registry.k8s.io go to the cache mirror01.fleet.example:5001 first, then https://registry.k8s.io",
        "pulls of nvcr.io go to the cache mirror01.fleet.example:5002 first, then https://nvcr.io "
        "(the cache fetches from https://harbor.fleet.example/v2/nvcr)"]
    assert len(row["notes"]) == len(matrix.load("k8s-1.36").upstream_registries)


def errors(ini: Path, capsys) -> list[str]:
    assert run(["validate", str(ini), "--skip-files"]) == 2
    return capsys.readouterr().err.splitlines()[1:]


def test_a_remote_for_an_upstream_the_release_does_not_pull_from_is_located(tmp_path, capsys):
    ini = connected_site(tmp_path, CONNECTED + "    cache_remotes:\n      quay.example: https://proxy/quay\n")
    all_vars = ini.parent / "group_vars" / "all.yml"
    found = errors(ini, capsys)
    assert len(found) == 1
    assert found[0].startswith(f"  {all_vars}:5 gpuboot.mirror.cache_remotes.quay.example: 'quay.example' is not a "
                               "registry release k8s-1.36 pulls from, so it has no cache (fix: use one of: registry.k8s.io,")


def test_cache_remotes_in_an_air_gap_is_refused(tmp_path, capsys):
    ini = connected_site(tmp_path, CONNECTED + "    air_gapped: true\n    cache_remotes: {nvcr.io: 'https://p/n'}\n")
    found = errors(ini, capsys)
    assert len(found) == 1 and "an air-gapped mirror holds every image itself: remove cache_remotes" in found[0]


@pytest.mark.parametrize(("mirror", "where", "says"), [
    ("  mirror:\n    registry: mirror01.fleet.example:65530\n", "registry",
     "caches take the ports after the mirror's (65531-65537), past 65535"),
    ("  mirror:\n    registry: mirror01.fleet.example:8440\n"
     "    packages_url: https://mirror01.fleet.example:8443/os\n", "packages_url",
     "port 8443 is taken by the pull-through caches (8441-8447"),
])
def test_ports_the_caches_cannot_take_are_located(mirror, where, says, tmp_path, capsys):
    ini = connected_site(tmp_path, mirror)
    found = errors(ini, capsys)
    assert len(found) == 1, found
    assert f"gpuboot.mirror.{where}: " in found[0] and says in found[0]
