"""Credentials stay with their host: Basic and bearer credentials go to the registry's own origin and to the
token realm it names, never to an upload Location or a redirect on another origin (issue 39, finding 4).

Real HTTP servers on 127.0.0.1, each on its own port (another port is another origin), record every request's
Authorization header.
"""
from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
from typing import Callable, Dict, List, Optional, Tuple

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.registry.client import Credentials, Registry, origin_of
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import RegistryError

USER, PASSWORD = "pusher", "s3cret-marker-7f1c"
BASIC = "Basic " + base64.b64encode(("%s:%s" % (USER, PASSWORD)).encode()).decode()
TOKEN = "token-marker-91ab"
BLOB = b"layer bytes"
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()

# handler(method, path, headers) -> (status, headers, body)
Answer = Tuple[int, Dict[str, str], bytes]


class Server:
    """One origin: records (method, path, Authorization) and answers through ``handle``."""

    def __init__(self) -> None:
        self.seen: List[Tuple[str, str, Optional[str]]] = []
        self.handle: Callable[[str, str, Dict[str, str]], Answer] = lambda m, p, h: (404, {}, b"")
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                server.seen.append((self.command, self.path, self.headers.get("Authorization")))
                status, headers, body = server.handle(self.command, self.path, dict(self.headers))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any  # noqa: N815 (http.server's names)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = "127.0.0.1:%d" % self.httpd.server_address[1]
        self.url = "http://" + self.host
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def auths(self) -> List[Optional[str]]:
        return [a for _m, _p, a in self.seen]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made: List[Server] = []

    def make() -> Server:
        made.append(Server())
        return made[-1]
    yield make
    for server in made:
        server.close()


def basic_registry(own: Server, upload_location: str, blob_redirect: str = "") -> None:
    """A registry wanting Basic auth whose upload session (and, optionally, blob GET) points elsewhere."""
    def handle(method: str, path: str, headers: Dict[str, str]) -> Answer:
        if headers.get("Authorization") != BASIC:
            return 401, {"WWW-Authenticate": 'Basic realm="test"'}, b""
        if path == "/v2/":
            return 200, {}, b"{}"
        if method == "HEAD" and "/blobs/" in path:
            return 404, {}, b""
        if method == "POST" and path.startswith("/v2/cloud/x/blobs/uploads/"):
            return 202, {"Location": upload_location}, b""
        if method == "GET" and "/blobs/" in path and blob_redirect:
            return 307, {"Location": blob_redirect}, b""
        return 404, {}, b""
    own.handle = handle


def test_the_origin_includes_scheme_and_port():
    assert origin_of("https://r.example:443/v2/") == origin_of("https://R.example/x") == ("https", "r.example", 443)
    assert origin_of("http://127.0.0.1:5000/") != origin_of("http://127.0.0.1:5001/")
    assert origin_of("http://r.example/") != origin_of("https://r.example/")


def test_basic_credentials_do_not_follow_an_upload_location_to_another_host(servers):
    registry, elsewhere = servers(), servers()
    basic_registry(registry, elsewhere.url + "/upload/session-1?_state=x")
    elsewhere.handle = lambda m, p, h: (201, {}, b"")
    client = Registry(registry.host, Credentials(USER, PASSWORD), plain_http=True, retries=0)
    try:
        assert client.ping() == "basic"
        assert client.upload_blob("cloud/x", DIGEST, len(BLOB), data=BLOB) == "uploaded"
    finally:
        client.close()
    assert [m for m, _p, _a in elsewhere.seen] == ["PUT"]      # the blob went there ...
    assert elsewhere.auths() == [None]                          # ... without the credentials
    assert BASIC in registry.auths()                            # which the registry itself got


def test_a_401_from_another_host_is_not_answered_with_credentials(servers):
    registry, elsewhere = servers(), servers()
    basic_registry(registry, elsewhere.url + "/upload/session-1")
    # the foreign host asks for Basic credentials: it must not get them
    elsewhere.handle = lambda m, p, h: (401, {"WWW-Authenticate": 'Basic realm="give me"'}, b"")
    client = Registry(registry.host, Credentials(USER, PASSWORD), plain_http=True, retries=0)
    try:
        client.ping()
        with pytest.raises(RegistryError):
            client.upload_blob("cloud/x", DIGEST, len(BLOB), data=BLOB)
    finally:
        client.close()
    assert elsewhere.seen and elsewhere.auths() == [None] * len(elsewhere.seen)


def test_a_redirect_to_another_port_gets_no_credentials(servers):
    registry, storage = servers(), servers()
    basic_registry(registry, "/unused", blob_redirect=storage.url + "/blob-store/" + DIGEST)
    storage.handle = lambda m, p, h: (200, {}, BLOB)
    client = Registry(registry.host, Credentials(USER, PASSWORD), plain_http=True, retries=0)
    try:
        client.ping()
        assert client.get_blob("cloud/x", DIGEST) == BLOB
    finally:
        client.close()
    assert [m for m, _p, _a in storage.seen] == ["GET"]
    assert storage.auths() == [None]


def test_bearer_basic_goes_to_the_realm_and_the_token_only_to_the_registry(servers):
    registry, realm, elsewhere = servers(), servers(), servers()

    def token_service(method: str, path: str, headers: Dict[str, str]) -> Answer:
        if headers.get("Authorization") != BASIC:
            return 401, {}, b""
        return 200, {"Content-Type": "application/json"}, json.dumps({"token": TOKEN}).encode()
    realm.handle = token_service

    def handle(method: str, path: str, headers: Dict[str, str]) -> Answer:
        if headers.get("Authorization") != "Bearer " + TOKEN:
            return 401, {"WWW-Authenticate": 'Bearer realm="%s/token",service="test"' % realm.url}, b""
        if path == "/v2/":
            return 200, {}, b"{}"
        if method == "HEAD":
            return 404, {}, b""
        if method == "POST":
            return 202, {"Location": elsewhere.url + "/upload/session-2"}, b""
        return 404, {}, b""
    registry.handle = handle
    elsewhere.handle = lambda m, p, h: (201, {}, b"")
    client = Registry(registry.host, Credentials(USER, PASSWORD), plain_http=True, retries=0)
    try:
        assert client.ping() == "bearer"
        assert client.upload_blob("cloud/x", DIGEST, len(BLOB), data=BLOB) == "uploaded"
    finally:
        client.close()
    assert realm.auths() and set(realm.auths()) == {BASIC}          # the realm the registry named: Basic
    assert "Bearer " + TOKEN in registry.auths()                    # the registry: the token
    assert BASIC not in registry.auths()
    assert elsewhere.auths() == [None]                              # the foreign Location: nothing


def test_a_realm_that_is_not_http_is_refused(servers):
    registry = servers()
    registry.handle = lambda m, p, h: (401, {"WWW-Authenticate": 'Bearer realm="file:///etc/passwd",service="x"'}, b"")
    client = Registry(registry.host, Credentials(USER, PASSWORD), plain_http=True, retries=0)
    try:
        with pytest.raises(RegistryError, match="realm"):
            client.ping()
    finally:
        client.close()
