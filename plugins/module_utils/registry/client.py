# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A small OCI distribution client on ``requests``.

Why not oras or python-dxf: see docs/registry.md.  What this client does that
they do not: it authenticates (challenge flow, token cached per scope) with a
body-less request before it streams a blob, so a 401 never consumes a body;
it sends every blob monolithically with a known Content-Length (the
registry rejects chunked transfer); a cut connection restarts that one blob
with a new upload session; manifests keep their own media type.
"""

from __future__ import annotations

import base64
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Tuple
from urllib.parse import urlencode, urljoin, urlsplit

from ansible_collections.metax.gpu.plugins.module_utils.backoff import Backoff
from ansible_collections.metax.gpu.plugins.module_utils.registry import reference as R
from ansible_collections.metax.gpu.plugins.module_utils.registry.blobs import CHUNK, sha256_digest
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import (
    AuthError, RegistryError, StreamRefused, TransientError)

try:
    import requests  # type: ignore[import-untyped,unused-ignore]
    from requests.adapters import HTTPAdapter  # type: ignore[import-untyped,unused-ignore]
    import urllib3  # requests' own dependency
    HAS_REQUESTS = True
    REQUESTS_IMPORT_ERROR: Optional[ImportError] = None
except ImportError as exc:  # pragma: no cover
    requests = urllib3 = None  # type: ignore[assignment]
    HTTPAdapter = None  # type: ignore[assignment,misc]
    HAS_REQUESTS = False
    REQUESTS_IMPORT_ERROR = exc

_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass
class Credentials:
    username: str = ""
    password: str = ""

    def basic(self) -> str:
        return "Basic " + base64.b64encode(("%s:%s" % (self.username, self.password)).encode()).decode()

    def __bool__(self) -> bool:
        return bool(self.username)


class _Body:
    """A file slice for requests: a known length (no chunked transfer), hashed while it is read.

    ``read`` hands out 1 MiB whatever size the HTTP layer asks for: urllib3
    asks for 16 KiB, and 64 x more system calls cost a third of the throughput.
    """

    def __init__(self, path: str, offset: int, size: int, progress: Optional[Callable[[int], None]] = None) -> None:
        self.handle = open(path, "rb")
        self.handle.seek(offset)
        self.remaining = size
        self.size = size
        self.progress = progress

    def __len__(self) -> int:
        return self.remaining

    def read(self, amount: int = -1) -> bytes:
        if self.remaining <= 0:
            return b""
        data = self.handle.read(min(max(amount, CHUNK), self.remaining))
        self.remaining -= len(data)
        if self.progress and data:
            self.progress(len(data))
        return data

    def close(self) -> None:
        self.handle.close()


class Registry:
    """One registry endpoint (``host[:port]``)."""

    def __init__(self, host: str, credentials: Optional[Credentials] = None, plain_http: bool = False,
                 validate_certs: bool = True, ca_path: Optional[str] = None, timeout: float = 60.0,
                 retries: int = 5, pool: int = 8) -> None:
        if not HAS_REQUESTS:
            raise RegistryError("the registry client needs the Python package requests (pip install requests)")
        self.host = R.host(host)
        self.base = ("http://" if plain_http else "https://") + host
        self.origin = origin_of(self.base)
        self.credentials = credentials or Credentials()
        self.timeout = timeout
        self.retries = retries
        self.session = requests.Session()
        adapter = HTTPAdapter(pool_connections=pool, pool_maxsize=pool)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.trust_env = False
        self.session.verify = (ca_path or True) if validate_certs else False
        if not validate_certs:
            # asked for explicitly (validate_certs=false): no warning per request
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self.session.headers["User-Agent"] = "metax.gpu-registry-push"
        self._lock = threading.Lock()
        self._fetch_lock = threading.Lock()
        self._tokens: Dict[str, str] = {}
        self._scheme: Optional[str] = None
        self._challenge: Dict[str, str] = {}

    # -- authentication ---------------------------------------------------------------------------

    def ping(self) -> str:
        """GET /v2/; returns the auth scheme the registry wants ('' = anonymous)."""
        resp = self._send("GET", "/v2/", scope=None)
        if resp.status_code == 401:
            raise self._auth_error(resp)
        if resp.status_code != 200:
            raise RegistryError("%s/v2/ answered %d: is %s an OCI registry?" % (self.base, resp.status_code, self.host))
        return self._scheme or ""

    def _auth_error(self, resp) -> AuthError:
        how = ("the credentials were refused" if self.credentials else "it needs credentials")
        return AuthError(
            "registry %s: %s (HTTP %d %s). Supply them with username/password, or log in first "
            "(docker login / podman login %s) so that the auth file holds them."
            % (self.host, how, resp.status_code, _error_text(resp), self.host))

    def _authorization(self, scope: Optional[str]) -> Optional[str]:
        if self._scheme == "basic" and self.credentials:
            return self.credentials.basic()
        if self._scheme == "bearer":
            token = self._tokens.get(scope or "")
            if token is None:
                # fetch before sending: parallel blob uploads would otherwise each take a 401 and a token
                with self._fetch_lock:
                    if (scope or "") not in self._tokens:
                        self._fetch_token(scope)
                token = self._tokens.get(scope or "")
            return "Bearer " + token if token else None
        return None

    def _learn_challenge(self, header: str, scope: Optional[str]) -> None:
        scheme, _sep, rest = header.partition(" ")
        params = dict(_CHALLENGE_PARAM.findall(rest))
        with self._lock:
            self._scheme = scheme.lower()
            self._challenge = params
        if self._scheme == "bearer":
            self._fetch_token(scope)
        elif self._scheme != "basic":
            raise AuthError("registry %s: unsupported auth scheme %r" % (self.host, scheme))
        elif not self.credentials:
            raise AuthError("registry %s needs credentials (basic auth). Supply username/password or log in "
                            "(docker login / podman login %s)." % (self.host, self.host))

    def _fetch_token(self, scope: Optional[str]) -> None:
        realm = self._challenge.get("realm")
        if not realm:
            raise AuthError("registry %s: bearer challenge without a realm" % self.host)
        if urlsplit(realm).scheme not in ("http", "https") or not urlsplit(realm).hostname:
            raise AuthError("registry %s: bearer realm %r is not an http(s) URL" % (self.host, realm))
        # one scope parameter per scope (what Docker's token spec and Harbor expect)
        query = [("service", self._challenge.get("service", ""))] + [("scope", s) for s in (scope or "").split()]
        headers = {"Authorization": self.credentials.basic()} if self.credentials else {}
        try:
            resp = self.session.get(realm, params=query, headers=headers, timeout=self.timeout)
        except requests.RequestException as exc:
            raise AuthError("registry %s: token service %s unreachable: %s" % (self.host, realm, exc)) from exc
        if resp.status_code != 200:
            raise self._auth_error(resp)
        body = resp.json()
        token = body.get("token") or body.get("access_token")
        if not token:
            raise AuthError("registry %s: token service %s returned no token" % (self.host, realm))
        with self._lock:
            self._tokens[scope or ""] = token

    def _send(self, method: str, path: str, scope: Optional[str], body_factory: Optional[Callable[[], object]] = None,
              headers: Optional[Dict[str, str]] = None, params: Optional[Dict[str, str]] = None,
              data: Optional[bytes] = None, stream: bool = False):
        """One request; on a 401 learn the challenge, authenticate, and send once more.

        Credentials go only to the registry's own origin (scheme, host, port): an upload
        ``Location`` on another host (a storage backend, or a hostile registry) gets the
        request without them, and its 401 is not answered with credentials either.
        Redirects: requests drops the Authorization header when the host, port or scheme
        changes (``Session.rebuild_auth``); tests/unit/registry/test_credentials_origin.py
        proves both with two servers.
        """
        url = path if path.startswith("http") else urljoin(self.base, path)
        own = origin_of(url) == self.origin
        for attempt in (1, 2):
            hdrs = dict(headers or {})
            auth = self._authorization(scope) if own else None
            if auth:
                hdrs["Authorization"] = auth
            body: Any = body_factory() if body_factory else data
            try:
                resp = self.session.request(method, url, headers=hdrs, params=params, data=body,
                                            timeout=self.timeout, stream=stream, allow_redirects=True)
            except requests.exceptions.SSLError as exc:
                raise RegistryError("registry %s: TLS verification failed (%s). Give the CA with ca_path, or "
                                    "plain_http for a registry without TLS." % (self.host, exc)) from exc
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                raise TransientError("registry %s: %s %s: %s" % (self.host, method, path, exc)) from exc
            finally:
                if hasattr(body, "close"):
                    body.close()
            if resp.status_code != 401 or attempt == 2 or not own:
                return resp
            challenge = resp.headers.get("WWW-Authenticate", "")
            if not challenge:
                raise self._auth_error(resp)
            already = self._authorization(scope) is not None and self._scheme == "basic"
            self._learn_challenge(challenge, scope)
            if already:  # basic credentials were sent and refused
                raise self._auth_error(resp)
            if body is not None and not isinstance(body, (bytes, _Body)) and body_factory is None:
                # a consumed stream cannot be sent again: the caller restarts the blob (new session)
                raise TransientError("registry %s: authentication expired during %s %s" % (self.host, method, path))
        raise AssertionError("unreachable")

    # -- blobs ------------------------------------------------------------------------------------

    @staticmethod
    def scope(repo: str, actions: str = "pull,push", extra: Iterable[str] = ()) -> str:
        # every request about a repository asks for its scope first: the names are checked here once
        for name in [repo] + list(extra):
            R.repository(name)
        return " ".join(["repository:%s:%s" % (repo, actions)] + ["repository:%s:pull" % e for e in extra])

    def blob_exists(self, repo: str, digest: str) -> bool:
        R.digest(digest)
        resp = self._send("HEAD", "/v2/%s/blobs/%s" % (repo, digest), self.scope(repo))
        if resp.status_code == 401:
            raise self._auth_error(resp)
        if resp.status_code >= 500:
            raise TransientError("registry %s: HEAD blob %s: HTTP %d" % (self.host, digest, resp.status_code))
        return resp.status_code == 200

    def upload_blob(self, repo: str, digest: str, size: int, path: Optional[str] = None, data: Optional[bytes] = None,
                    offset: int = 0, mount_from: Optional[str] = None, progress: Optional[Callable[[int], None]] = None) -> str:
        """Upload one blob; returns 'exists', 'mounted' or 'uploaded'.  Restarts on transient failures."""
        backoff = Backoff(initial=0.2, cap=5.0)
        last: Optional[Exception] = None
        for attempt in range(self.retries + 1):
            try:
                if self.blob_exists(repo, digest):
                    return "exists"
                return self._upload_once(repo, digest, size, path, offset, data, mount_from if attempt == 0 else None,
                                         progress)
            except TransientError as exc:
                last = exc
                time.sleep(backoff.next_delay())
        raise RegistryError("registry %s: blob %s of %s failed %d times; last error: %s"
                            % (self.host, digest, repo, self.retries + 1, last))

    def mount_blob(self, repo: str, digest: str, from_repo: str) -> bool:
        """Cross-repository mount; False when the registry fell back to an upload session (then cancelled)."""
        R.digest(digest)
        resp = self._send("POST", "/v2/%s/blobs/uploads/" % repo, self.scope(repo, extra=[from_repo]),
                          params={"mount": digest, "from": from_repo}, headers={"Content-Length": "0"})
        if resp.status_code == 201:
            return True
        self._check(resp, (202,), "mount %s from %s into %s" % (digest, from_repo, repo))
        location = resp.headers.get("Location")
        if location:
            self._send("DELETE", urljoin(self.base, location), self.scope(repo))
        return False

    def _start_upload(self, repo: str, digest: str) -> str:
        # the POST carries no body: any 401 is settled here, before a byte of the blob is read
        resp = self._send("POST", "/v2/%s/blobs/uploads/" % repo, self.scope(repo), headers={"Content-Length": "0"})
        self._check(resp, (202,), "start upload of %s to %s" % (digest or "a layer", repo))
        location = resp.headers.get("Location")
        if not location:
            raise RegistryError("registry %s: upload session without Location" % self.host)
        return urljoin(self.base, location)

    @staticmethod
    def _with_digest(location: str, digest: str) -> str:
        return location + ("&" if "?" in location else "?") + urlencode({"digest": digest})

    def _upload_once(self, repo, digest, size, path, offset, data, mount_from, progress) -> str:
        if mount_from and self.mount_blob(repo, digest, mount_from):
            return "mounted"
        url = self._with_digest(self._start_upload(repo, digest), digest)
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        scope = self.scope(repo)
        if path is not None:
            factory: Callable[[], object] = lambda: _Body(path, offset, size, progress)
            resp = self._send("PUT", url, scope, body_factory=factory, headers=headers)
        else:
            resp = self._send("PUT", url, scope, data=data, headers=headers)
        if resp.status_code == 404:  # the registry cancelled the session (BLOB_UPLOAD_INVALID/UNKNOWN)
            raise TransientError("registry %s: upload session of %s vanished: %s" % (self.host, digest, _error_text(resp)))
        self._check(resp, (201,), "upload %s to %s" % (digest, repo))
        return "uploaded"

    def upload_stream(self, repo: str, make_converter: Callable[[], object],
                      progress: Optional[Callable[[int], None]] = None) -> Tuple[str, int]:
        """Upload a layer compressed on the fly (one chunked PATCH, then PUT ?digest=); returns (digest, size).

        The digest is known only at the end of the stream, so the blob cannot
        be HEAD-checked first; the caller does that with a cached digest.  A
        failure restarts the whole layer with a new session.
        """
        backoff = Backoff(initial=0.2, cap=5.0)
        last: Optional[Exception] = None
        for _attempt in range(self.retries + 1):
            conv = make_converter()
            conv.progress = progress  # type: ignore[attr-defined]
            try:
                location = self._start_upload(repo, "")
                digest = self.stream_upload_once(location, repo, conv.chunks(),  # type: ignore[attr-defined]
                                                 lambda c=conv: c.digest,  # type: ignore[misc]
                                                 body_error=lambda c=conv: c.error)  # type: ignore[misc]
                return digest, conv.size  # type: ignore[attr-defined]
            except TransientError as exc:
                last = exc
                time.sleep(backoff.next_delay())
        raise RegistryError("registry %s: a layer of %s failed %d times; last error: %s"
                            % (self.host, repo, self.retries + 1, last))

    def start_upload(self, repo: str) -> str:
        """Open an upload session (body-less, so authentication is settled first); returns its URL."""
        return self._start_upload(repo, "")

    def stream_upload_once(self, location: str, repo: str, chunks: Iterable[bytes],
                           digest_of: Callable[[], str],
                           body_error: Optional[Callable[[], Optional[Exception]]] = None) -> str:
        """Send ``chunks`` as one chunked PATCH to an open session, then commit it with the digest
        ``digest_of()`` gives once the body is consumed; no retry (the caller owns the source stream).
        ``body_error()``: what went wrong producing the body, raised before the registry's answer
        is read (a body cut short by its producer is not the registry's refusal).
        Returns the digest; raises TransientError when the session or the connection died."""
        resp = self._send("PATCH", location, self.scope(repo), data=chunks,  # type: ignore[arg-type]
                          headers={"Content-Type": "application/octet-stream"})
        if body_error is not None:
            error = body_error()
            if isinstance(error, Exception):
                raise error
        if resp.status_code == 404:
            raise TransientError("registry %s: upload session vanished: %s" % (self.host, _error_text(resp)))
        if resp.status_code in (400, 411, 413, 501):
            raise StreamRefused("registry %s: chunked upload refused: HTTP %d %s"
                                % (self.host, resp.status_code, _error_text(resp)))
        self._check(resp, (202,), "upload a layer to %s" % repo)
        location = urljoin(self.base, resp.headers.get("Location") or location)
        digest = digest_of()
        resp = self._send("PUT", self._with_digest(location, digest), self.scope(repo),
                          headers={"Content-Length": "0"}, data=b"")
        if resp.status_code == 404:
            raise TransientError("registry %s: upload session of %s vanished" % (self.host, digest))
        self._check(resp, (201,), "commit %s to %s" % (digest, repo))
        return digest

    def cancel_upload(self, location: str, repo: str) -> None:
        """Best effort: a cancelled session leaves nothing behind in the repository."""
        try:
            self._send("DELETE", location, self.scope(repo))
        except RegistryError:
            pass

    def get_blob(self, repo: str, digest: str) -> bytes:
        R.digest(digest)
        resp = self._send("GET", "/v2/%s/blobs/%s" % (repo, digest), self.scope(repo, "pull"))
        self._check(resp, (200,), "get blob %s of %s" % (digest, repo))
        if sha256_digest(resp.content) != digest:
            raise RegistryError("registry %s: blob %s of %s does not match its digest" % (self.host, digest, repo))
        return resp.content

    # -- manifests --------------------------------------------------------------------------------

    def manifest_digest(self, repo: str, reference: str, media_types: Iterable[str]) -> Optional[str]:
        """The digest a tag (or digest) points at, None if absent."""
        R.reference(reference)
        resp = self._send("HEAD", "/v2/%s/manifests/%s" % (repo, reference), self.scope(repo),
                          headers={"Accept": ", ".join(media_types)})
        if resp.status_code == 404:
            return None
        self._check(resp, (200,), "HEAD manifest %s:%s" % (repo, reference))
        return resp.headers.get("Docker-Content-Digest")

    def get_manifest(self, repo: str, reference: str, media_types: Iterable[str]) -> Tuple[bytes, str]:
        R.reference(reference)
        resp = self._send("GET", "/v2/%s/manifests/%s" % (repo, reference), self.scope(repo, "pull"),
                          headers={"Accept": ", ".join(media_types)})
        self._check(resp, (200,), "get manifest %s:%s" % (repo, reference))
        if reference.startswith("sha256:") and sha256_digest(resp.content) != reference:
            raise RegistryError("registry %s: manifest %s of %s does not match its digest" % (self.host, reference, repo))
        return resp.content, resp.headers.get("Content-Type", "")

    def put_manifest(self, repo: str, reference: str, body: bytes, media_type: str) -> str:
        R.reference(reference)
        backoff = Backoff(initial=0.2, cap=5.0)
        for attempt in range(self.retries + 1):
            try:
                resp = self._send("PUT", "/v2/%s/manifests/%s" % (repo, reference), self.scope(repo),
                                  data=body, headers={"Content-Type": media_type})
                self._check(resp, (201,), "put manifest %s:%s (%s)" % (repo, reference, media_type))
                digest = sha256_digest(body)
                returned = resp.headers.get("Docker-Content-Digest")
                if returned and returned != digest:
                    raise RegistryError("registry %s stored manifest %s as %s" % (self.host, digest, returned))
                return digest
            except TransientError:
                if attempt == self.retries:
                    raise
                time.sleep(backoff.next_delay())
        raise AssertionError("unreachable")

    def _check(self, resp, ok: Tuple[int, ...], what: str) -> None:
        if resp.status_code in ok:
            return
        if resp.status_code == 401:
            raise self._auth_error(resp)
        text = _error_text(resp)
        if resp.status_code >= 500:
            raise TransientError("registry %s: %s: HTTP %d %s (a full disk or a failing storage backend?)"
                                 % (self.host, what, resp.status_code, text))
        if resp.status_code == 403:
            raise AuthError("registry %s: %s: permission denied (HTTP 403 %s); the account needs push rights"
                            % (self.host, what, text))
        if "MANIFEST_INVALID" in text or "UNSUPPORTED" in text or resp.status_code == 415:
            raise RegistryError("registry %s refused the media type: %s: HTTP %d %s"
                                % (self.host, what, resp.status_code, text))
        raise RegistryError("registry %s: %s: HTTP %d %s" % (self.host, what, resp.status_code, text))

    def close(self) -> None:
        self.session.close()


def _error_text(resp) -> str:
    try:
        errors = resp.json().get("errors") or []
        return "; ".join("%s: %s" % (e.get("code"), e.get("message")) for e in errors) or resp.reason or ""
    except ValueError:
        return (resp.reason or "").strip()


def origin_of(url: str) -> Tuple[str, str, int]:
    """(scheme, host, port) of a URL, the port made explicit: what credentials are bound to."""
    parts = urlsplit(url)
    scheme = (parts.scheme or "").lower()
    try:
        port = parts.port
    except ValueError:
        port = -1       # not a port at all: never equal to the registry's
    return scheme, (parts.hostname or "").lower(), port if port is not None else (443 if scheme == "https" else 80)


def split_registry(ref: str) -> Tuple[str, str]:
    """'DOMAIN[:port]/PROJECT/path' -> ('DOMAIN[:port]', 'PROJECT/path'), both checked (reference.registry)."""
    return R.registry(ref)
