"""A small client for the OCI distribution API (what every registry speaks): manifests
and blobs, streamed, with Basic and anonymous/credentialed Bearer auth. Manifests are
moved as the exact bytes the registry served, so every digest is preserved."""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from gpuboot.errors import MirrorError

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
INDEX_TYPES = MANIFEST_TYPES[0], MANIFEST_TYPES[2]
CHUNK = 1 << 20


@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str
    digest: str

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES

    def document(self) -> dict:
        return json.loads(self.body)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_credentials(path: str | None) -> tuple[str, str] | None:
    """`{"username": ..., "password": ...}` in a file only its owner reads."""
    if not path:
        return None
    try:
        data = json.loads(open(path, encoding="utf-8").read())
        return str(data["username"]), str(data["password"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MirrorError(f"credentials file {path} is unreadable or malformed ({type(exc).__name__})",
                          hint='write {"username": "...", "password": "..."} into it, mode 0600') from None


class Registry:
    """One registry endpoint. `prefix` is prepended to repository names (a test upstream
    that holds nvcr.io's images under /nvcr.io/...)."""

    def __init__(self, url: str, *, ca_file: str | None = None, credentials: tuple[str, str] | None = None,
                 prefix: str = "", timeout: float = 120) -> None:
        parsed = urllib.parse.urlsplit(url if "://" in url else f"https://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise MirrorError(f"registry address {url!r} is not http(s)://HOST[:PORT]")
        self.url = f"{parsed.scheme}://{parsed.netloc}"
        self.scheme, self.netloc = parsed.scheme, parsed.netloc
        self.prefix = "/".join(p for p in (prefix.strip("/"), parsed.path.strip("/")) if p)
        self.ca_file = ca_file
        self.credentials = credentials
        self.timeout = timeout
        self._local = threading.local()
        self._tokens: dict[str, str] = {}
        self._lock = threading.Lock()
        self._tls = ssl.create_default_context(cafile=ca_file) if parsed.scheme == "https" else None

    # -- transport ---------------------------------------------------------------
    def _connection(self, netloc: str | None = None, scheme: str | None = None) -> http.client.HTTPConnection:
        netloc, scheme = netloc or self.netloc, scheme or self.scheme
        if netloc != self.netloc:  # a redirect elsewhere (blob storage): a fresh connection
            return self._new(netloc, scheme, ssl.create_default_context() if scheme == "https" else None)
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._new(netloc, scheme, self._tls)
        return conn

    def _new(self, netloc: str, scheme: str, context) -> http.client.HTTPConnection:
        if scheme == "https":
            return http.client.HTTPSConnection(netloc, timeout=self.timeout, context=context, blocksize=CHUNK)
        return http.client.HTTPConnection(netloc, timeout=self.timeout, blocksize=CHUNK)

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _send(self, method: str, path: str, headers: dict[str, str], body=None) -> http.client.HTTPResponse:
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                return conn.getresponse()
            except ssl.SSLCertVerificationError as exc:
                self._drop()
                raise MirrorError(f"TLS verification of registry {self.netloc} failed: {exc.verify_message}",
                                  hint=f"pass the CA that signed the registry's certificate with --ca-file"
                                       f"{f' ({self.ca_file} is not it)' if self.ca_file else ''}") from None
            except (TimeoutError, ConnectionError, http.client.HTTPException, OSError) as exc:
                self._drop()
                # A kept-alive connection the server closed: retry once on a new one,
                # unless the body was a stream that is already partly sent.
                if attempt == 2 or (body is not None and not isinstance(body, bytes)):
                    raise MirrorError(f"registry {self.netloc} unreachable: {exc}",
                                      hint="check the address and that the registry is running") from None
            except BaseException:
                self._drop()  # a request aborted half-way (e.g. a corrupt blob) leaves the socket unusable
                raise
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, *, headers: dict[str, str] | None = None, body=None,
                ok: tuple[int, ...] = (200,)) -> http.client.HTTPResponse:
        headers = dict(headers or {})
        auth = self._auth_header(path)
        if auth:
            headers["Authorization"] = auth
        response = self._send(method, path, headers, body)
        if response.status == 401 and (body is None or isinstance(body, bytes)):
            challenge = response.getheader("WWW-Authenticate", "")
            response.read()
            headers["Authorization"] = self._answer(challenge, path)
            response = self._send(method, path, headers, body)
        if response.status not in ok:
            text = response.read(2048).decode("utf-8", "replace")
            raise RegistryStatus(method, self.netloc, path, response.status, text)
        return response

    # -- auth --------------------------------------------------------------------
    def _auth_header(self, path: str) -> str | None:
        with self._lock:
            token = self._tokens.get(self._scope_key(path)) or self._tokens.get("*")
        return token

    @staticmethod
    def _scope_key(path: str) -> str:
        match = re.match(r"/v2/(.+?)/(manifests|blobs|tags)/", path)
        return match.group(1) if match else "*"

    def _basic(self) -> str:
        if not self.credentials:
            raise MirrorError(f"registry {self.netloc} asks for credentials",
                              hint="pass --credentials-file (JSON with username and password)")
        user, password = self.credentials
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def _answer(self, challenge: str, path: str) -> str:
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            value = self._basic()
            with self._lock:
                self._tokens["*"] = value
            return value
        if scheme.lower() != "bearer":
            raise MirrorError(f"registry {self.netloc} wants unsupported auth {scheme!r}")
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        query = {k: fields[k] for k in ("service", "scope") if k in fields}
        realm = urllib.parse.urlsplit(fields.get("realm", ""))
        conn = self._new(realm.netloc, realm.scheme, self._tls if realm.netloc == self.netloc else ssl.create_default_context())
        headers = {"Authorization": self._basic()} if self.credentials else {}
        try:
            conn.request("GET", f"{realm.path}?{urllib.parse.urlencode(query)}", headers=headers)
            reply = conn.getresponse()
            data = json.loads(reply.read() or b"{}")
        finally:
            conn.close()
        token = data.get("token") or data.get("access_token")
        if reply.status != 200 or not token:
            raise MirrorError(f"registry {self.netloc}: token request to {realm.netloc} failed ({reply.status})",
                              hint="check --credentials-file")
        value = f"Bearer {token}"
        with self._lock:
            self._tokens[self._scope_key(path)] = value
        return value

    # -- API ---------------------------------------------------------------------
    def _repo(self, repository: str) -> str:
        return f"{self.prefix}/{repository}" if self.prefix else repository

    def manifest(self, repository: str, reference: str) -> Manifest:
        path = f"/v2/{self._repo(repository)}/manifests/{reference}"
        response = self.request("GET", path, headers={"Accept": ", ".join(MANIFEST_TYPES)})
        body = response.read()
        media_type = (response.getheader("Content-Type") or "").split(";")[0].strip()
        if media_type not in MANIFEST_TYPES:
            media_type = json.loads(body).get("mediaType", media_type)
        digest = sha256_digest(body)
        if reference.startswith("sha256:") and digest != reference:
            raise MirrorError(f"{self.netloc}/{repository}@{reference}: the registry served a manifest "
                              f"whose digest is {digest}")
        return Manifest(body, media_type, digest)

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest a tag points at, or None when the registry does not have it."""
        try:
            response = self.request("HEAD", f"/v2/{self._repo(repository)}/manifests/{reference}",
                                    headers={"Accept": ", ".join(MANIFEST_TYPES)})
        except RegistryStatus as exc:
            if exc.status == 404:
                return None
            raise
        response.read()
        return response.getheader("Docker-Content-Digest")

    def has_blob(self, repository: str, digest: str) -> bool:
        try:
            self.request("HEAD", f"/v2/{self._repo(repository)}/blobs/{digest}").read()
            return True
        except RegistryStatus as exc:
            if exc.status == 404:
                return False
            raise

    def blob_chunks(self, repository: str, digest: str) -> Iterator[bytes]:
        response = self.request("GET", f"/v2/{self._repo(repository)}/blobs/{digest}",
                                ok=(200, 301, 302, 303, 307, 308))
        if response.status != 200:  # blob storage elsewhere: follow without our credentials
            response.read()
            target = urllib.parse.urlsplit(response.getheader("Location", ""))
            conn = self._connection(target.netloc, target.scheme)
            conn.request("GET", target.path + (f"?{target.query}" if target.query else ""))
            response = conn.getresponse()
            if response.status != 200:
                raise RegistryStatus("GET", target.netloc, target.path, response.status, "")
        while chunk := response.read(CHUNK):
            yield chunk

    def mount_blob(self, repository: str, digest: str, source_repository: str) -> bool:
        path = (f"/v2/{self._repo(repository)}/blobs/uploads/?mount={digest}"
                f"&from={urllib.parse.quote(self._repo(source_repository), safe='/')}")
        response = self.request("POST", path, body=b"", ok=(201, 202))
        response.read()
        if response.status == 201:
            return True
        self._cancel(response.getheader("Location", ""))
        return False

    def _cancel(self, location: str) -> None:
        if location:
            try:
                self.request("DELETE", self._relative(location), ok=(204, 404)).read()
            except RegistryStatus:
                pass  # an abandoned upload session expires on the registry by itself

    def _relative(self, location: str) -> str:
        parsed = urllib.parse.urlsplit(location)
        return parsed.path + (f"?{parsed.query}" if parsed.query else "")

    def upload_blob(self, repository: str, digest: str, size: int, stream: BinaryIO) -> None:
        """Monolithic upload of `size` bytes from `stream`; the registry checks the digest."""
        response = self.request("POST", f"/v2/{self._repo(repository)}/blobs/uploads/", body=b"", ok=(202,))
        response.read()
        location = self._relative(response.getheader("Location", ""))
        sep = "&" if "?" in location else "?"
        self.request("PUT", f"{location}{sep}digest={digest}", body=stream,
                     headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                     ok=(201,)).read()

    def put_manifest(self, repository: str, reference: str, manifest: Manifest) -> None:
        response = self.request("PUT", f"/v2/{self._repo(repository)}/manifests/{reference}",
                                body=manifest.body, headers={"Content-Type": manifest.media_type}, ok=(201,))
        response.read()
        served = response.getheader("Docker-Content-Digest")
        if served and served != manifest.digest:
            raise MirrorError(f"{self.netloc}/{repository}:{reference}: the registry stored digest {served}, "
                              f"expected {manifest.digest}")


class RegistryStatus(MirrorError):
    """The registry answered with an unexpected HTTP status."""

    def __init__(self, method: str, netloc: str, path: str, status: int, text: str) -> None:
        self.status = status
        detail = text.strip().replace("\n", " ")[:300]
        super().__init__(f"{method} {netloc}{path.split('?')[0]}: HTTP {status}{f' {detail}' if detail else ''}")


def children(manifest: Manifest) -> list[dict]:
    """Child manifests of an index."""
    return list(manifest.document().get("manifests", [])) if manifest.is_index else []


def blobs_of(manifest: Manifest) -> list[dict]:
    """Config and layers of an image manifest (empty for an index)."""
    if manifest.is_index:
        return []
    doc = manifest.document()
    found = [doc["config"]] if "config" in doc else []
    return found + list(doc.get("layers", []))
