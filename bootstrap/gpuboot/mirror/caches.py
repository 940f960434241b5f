"""Pull-through caches for a connected site (`mirror.registry` set, `air_gapped` false).

The mirror host runs one registry in proxy mode per upstream registry the release pulls
from (distribution proxies one remote per instance). Each listens on the mirror's port + 1
+ the upstream's place in the release's `upstream_registries`; releases only append to that
list, so a cache keeps its port, and nodes their hosts.toml, across upgrades. Nodes ask
the cache first and the upstream itself after, so a cache that is down costs speed, not pulls.
"""
from __future__ import annotations

from dataclasses import dataclass

# Where containerd itself sends docker.io pulls (its built-in default host).
UPSTREAM_SERVERS = {"docker.io": "https://registry-1.docker.io"}
HIGHEST_PORT = 65535


@dataclass(frozen=True)
class Cache:
    upstream: str   # the registry name images carry (docker.io, nvcr.io, ...)
    server: str     # the upstream's own endpoint: nodes fall back to it
    remote: str     # what the cache fetches from: the upstream, or the site's own proxy of it
    host: str       # the mirror host, as nodes reach it
    port: int

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def as_data(self) -> dict[str, str | int]:
        return {"upstream": self.upstream, "server": self.server, "remote": self.remote,
                "endpoint": self.endpoint, "port": self.port}


def split_registry(registry: str) -> tuple[str, int]:
    """HOST:PORT (HOST alone: 443) of `mirror.registry`."""
    host, _, port = registry.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else (registry, 443)


def upstream_server(upstream: str) -> str:
    return UPSTREAM_SERVERS.get(upstream, f"https://{upstream}")


def caches(registry: str | None, air_gapped: bool, upstreams: list[str],
           remotes: dict[str, str] | None = None) -> list[Cache]:
    """The site's caches, one per upstream in the release's order; none in an air gap (the
    mirror is the only source there) or without a mirror."""
    if not registry or air_gapped:
        return []
    host, port = split_registry(registry)
    remotes = remotes or {}
    return [Cache(name, upstream_server(name), remotes.get(name) or upstream_server(name), host, port + 1 + index)
            for index, name in enumerate(upstreams)]
