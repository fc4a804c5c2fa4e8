# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The modules' connection (kube/client.py: auth_from_params, api_client_for), kubernetes.core's options.

The pure half (options and K8S_AUTH_* in, a checked Auth out) by value; the client it builds against real
HTTP and HTTPS servers on 127.0.0.1 that record what arrives: the bearer token, basic auth, the impersonation
headers (one Impersonate-Group line per group), a proxy with its headers, no_proxy, a CA and a client
certificate. Against the real API server with a ServiceAccount token: tests/integration/test_kube_auth_cluster.py.
"""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import os
import ssl
import threading
from typing import Any, Dict, Iterator, List, Optional

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.kube import client as kube
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import Auth, KubeClientError, auth_from_params

from ports import free_port

TOKEN = "h14-unit-token-5e6f7a8b"
NODES = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "3"},
         "items": [{"metadata": {"name": "node-1"}}]}


# ---------------------------------------------------------------------------------------------
# options and environment (pure)

def test_options_win_over_the_environment_and_the_environment_fills_the_rest():
    env = {"K8S_AUTH_HOST": "https://env:6443", "K8S_AUTH_API_KEY": "env-token", "K8S_AUTH_CONTEXT": "ctx",
           "K8S_AUTH_IMPERSONATE_GROUPS": "g1,,g2", "K8S_AUTH_IMPERSONATE_USER": "alice"}
    auth = auth_from_params({"host": "https://given:6443/", "api_key": None}, env)
    assert auth.host == "https://given:6443"        # the trailing slash goes, as in kubernetes.core
    assert auth.api_key == "env-token" and auth.context == "ctx"
    assert auth.impersonate_user == "alice" and auth.impersonate_groups == ("g1", "g2")


@pytest.mark.parametrize("option, variables", [
    ("validate_certs", ("K8S_AUTH_VALIDATE_CERTS", "K8S_AUTH_VERIFY_SSL")),
    ("persist_config", ("K8S_AUTH_PERSIST_CONFIG",)),
])
@pytest.mark.parametrize("raw, expected", [("no", False), ("0", False), ("False", False), ("yes", True), ("1", True),
                                           ("true", True)])
def test_boolean_variables_read_as_kubernetes_core_reads_them(option, variables, raw, expected):
    for variable in variables:
        assert getattr(auth_from_params({}, {variable: raw}), option) is expected, variable


@pytest.mark.parametrize("option, variables", [
    ("ca_cert", ("K8S_AUTH_CA_CERT", "K8S_AUTH_SSL_CA_CERT")),
    ("client_cert", ("K8S_AUTH_CLIENT_CERT", "K8S_AUTH_CERT_FILE")),
    ("client_key", ("K8S_AUTH_CLIENT_KEY", "K8S_AUTH_KEY_FILE")),
])
def test_file_variables_by_either_name(tmp_path, option, variables):
    path = tmp_path / "file.pem"
    path.write_text("x")
    for variable in variables:
        assert getattr(auth_from_params({}, {variable: str(path)}), option) == str(path), variable


def test_proxy_headers_from_the_environment_only_when_the_option_is_not_given():
    env = {"K8S_AUTH_PROXY_HEADERS_PROXY_BASIC_AUTH": "u:p", "K8S_AUTH_PROXY_HEADERS_USER_AGENT": "metax/1"}
    assert auth_from_params({}, env).proxy_headers == {"proxy_basic_auth": "u:p", "user_agent": "metax/1"}
    given = {"proxy_headers": {"basic_auth": "a:b", "proxy_basic_auth": None, "user_agent": None}}
    assert auth_from_params(given, env).proxy_headers == {"basic_auth": "a:b"}


def test_an_empty_option_counts_as_not_given():
    auth = auth_from_params({"host": "", "api_key": "", "impersonate_groups": []}, {"K8S_AUTH_API_KEY": "t"})
    assert auth.host is None and auth.api_key == "t" and auth.impersonate_groups == ()


@pytest.mark.parametrize("params, fragment", [
    ({"host": "api.example:6443"}, "host 'api.example:6443' is not a URL"),
    ({"host": "ftp://api"}, "host 'ftp://api'"),
    ({"host": "https://"}, "host 'https:' is not a URL"),
    ({"host": "https://a b"}, "host"),
    ({"host": "https://api:99999999"}, "host"),
    ({"proxy": "proxy:3128"}, "proxy 'proxy:3128' is not a URL"),
    ({"impersonate_user": "a\nb"}, "impersonate_user holds a line break"),
    ({"impersonate_groups": ["ok", "a\rb"]}, "impersonate_groups holds a line break"),
    ({"proxy_headers": {"nonsense": "x"}}, "proxy_headers: unknown key(s) nonsense"),
    ({"kubeconfig": 7}, "kubeconfig must be a path or a dictionary, not int"),
    ({"kubeconfig": ["a"]}, "kubeconfig must be a path or a dictionary, not list"),
    ({"kubeconfig": "a\0b"}, "kubeconfig 'a\\x00b' is not a path"),
    ({"ca_cert": "/nonexistent/ca.crt"}, "ca_cert /nonexistent/ca.crt: no such file"),
])
def test_bad_options_are_refused_in_one_line(params, fragment):
    with pytest.raises(KubeClientError) as info:
        auth_from_params(params, {})
    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("option", ["api_key", "password"])
def test_a_bad_secret_is_refused_without_showing_it(option):
    with pytest.raises(KubeClientError) as info:
        auth_from_params({option: "SECRET\nx-injected: 1"}, {})
    assert option in str(info.value) and "SECRET" not in str(info.value)


def test_a_missing_client_key_is_refused_without_its_path():
    with pytest.raises(KubeClientError) as info:
        auth_from_params({"client_key": "/nonexistent/SECRETPATH.key"}, {})
    assert "client_key" in str(info.value) and "SECRETPATH" not in str(info.value)


def test_secrets_are_every_secret_and_never_in_repr_or_describe():
    kubeconfig = {"users": [{"name": "u", "user": {"token": "T1", "client-key-data": "K1", "username": "bob"}},
                            {"name": "o", "user": {"auth-provider": {"config": {"refresh-token": "R1", "id-token": "I1"}}}}]}
    auth = Auth(host="https://h", api_key="A1", password="P1", client_key="/k", kubeconfig=kubeconfig,
                proxy_headers={"proxy_basic_auth": "u:PB", "basic_auth": "u:B", "user_agent": "ua"})
    assert auth.secrets() == {"A1", "P1", "/k", "u:PB", "u:B", "T1", "K1", "R1", "I1"}
    for text in (repr(auth), auth.describe()):
        assert not any(secret in text for secret in auth.secrets()), text


@pytest.mark.parametrize("auth, expected", [
    (Auth(host="https://h:6443", api_key="t"), "host https://h:6443 with api_key"),
    (Auth(host="https://h:6443", username="u", password="p"), "host https://h:6443 with username/password"),
    (Auth(host="https://h:6443", client_cert="/c", client_key="/k"), "host https://h:6443 with client_cert"),
    (Auth(kubeconfig="/etc/k.conf", context="c"), "kubeconfig /etc/k.conf, context c"),
    (Auth(kubeconfig={"a": 1}), "kubeconfig given as a dictionary"),
    (Auth(context="c"), "default kubeconfig (KUBECONFIG or ~/.kube/config), context c"),
    (Auth(), "in-cluster service account, else KUBECONFIG or ~/.kube/config"),
    (Auth(host="https://h:6443", kubeconfig="/k"), "kubeconfig /k"),    # host alone is not enough: the file is read
])
def test_describe_names_where_the_connection_comes_from(auth, expected):
    assert auth.describe() == expected


# ---------------------------------------------------------------------------------------------
# the client it builds, against real servers

class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: List[Dict[str, Any]]

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append({"line": self.requestline, "path": self.path, "authorization": self.headers.get("Authorization"),
                          "user": self.headers.get_all("Impersonate-User") or [],
                          "groups": self.headers.get_all("Impersonate-Group") or [],
                          "proxy_authorization": self.headers.get("Proxy-Authorization"),
                          "user_agent": self.headers.get("User-Agent")})
        data = json.dumps(NODES).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server:
    def __init__(self, context: Optional[ssl.SSLContext] = None) -> None:
        self.seen: List[Dict[str, Any]] = []
        handler = type("Handler", (_Recorder,), {"seen": self.seen})
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        if context is not None:
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = "%s://127.0.0.1:%d" % ("https" if context else "http", self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def _no_cluster_of_this_machine(monkeypatch, tmp_path):
    for variable in list(os.environ):
        if variable.startswith("K8S_AUTH_") or variable.startswith("KUBERNETES_SERVICE_"):
            monkeypatch.delenv(variable)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))


def _nodes(auth: Auth) -> List[str]:
    client = kube.api_client_for(auth)
    with kube.reaching(client, auth):
        return [n["metadata"]["name"] for n in kube.core_v1(client).list_node()["items"]]


def test_host_and_api_key_send_the_bearer_token_and_the_impersonation_headers(server):
    auth = auth_from_params({"host": server.url, "api_key": TOKEN, "impersonate_user": "system:serviceaccount:a:b",
                             "impersonate_groups": ["metax-admins", "system:authenticated"]}, {})
    assert _nodes(auth) == ["node-1"]
    (request,) = server.seen
    assert request["authorization"] == "Bearer " + TOKEN
    assert request["user"] == ["system:serviceaccount:a:b"]
    # one header line per group: the API server would read "a, b" as one group
    assert request["groups"] == ["metax-admins", "system:authenticated"]


def test_username_and_password_send_basic_auth(server):
    assert _nodes(auth_from_params({"host": server.url, "username": "admin", "password": "pw"}, {})) == ["node-1"]
    assert server.seen[0]["authorization"] == "Basic " + base64.b64encode(b"admin:pw").decode()


def _kubeconfig(server_url: str, token: str) -> Dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": server_url}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": token}}]}


def test_api_key_overrides_the_kubeconfig_token_and_host_its_server(server, tmp_path):
    """Not enough alone (no host), api_key is laid over what the kubeconfig gave, as kubernetes.core does."""
    import yaml

    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(_kubeconfig(server.url, "file-token")))
    assert _nodes(auth_from_params({"kubeconfig": str(path)}, {})) == ["node-1"]
    assert _nodes(auth_from_params({"kubeconfig": str(path), "api_key": TOKEN}, {})) == ["node-1"]
    assert [r["authorization"] for r in server.seen] == ["Bearer file-token", "Bearer " + TOKEN]
    other = _Server()
    try:
        # host with a kubeconfig and no credential of its own: the file's token, sent to the given host
        auth = auth_from_params({"kubeconfig": str(path), "host": other.url, "ca_cert": str(path)}, {})
        client = kube.api_client_for(auth)
        for _request in range(3):      # the loader's token hook runs before each request: the options stay laid over it
            assert [n["metadata"]["name"] for n in kube.core_v1(client).list_node()["items"]] == ["node-1"]
        assert [r["authorization"] for r in other.seen] == ["Bearer file-token"] * 3
        assert client.configuration.ssl_ca_cert == str(path) and len(server.seen) == 2
    finally:
        other.close()


def test_a_kubeconfig_dictionary_and_the_environment_kubeconfig(server, tmp_path):
    import yaml

    assert _nodes(auth_from_params({"kubeconfig": _kubeconfig(server.url, "dict-token")}, {})) == ["node-1"]
    path = tmp_path / "env-config"
    path.write_text(yaml.safe_dump(_kubeconfig(server.url, "env-token")))
    assert _nodes(auth_from_params({}, {"K8S_AUTH_KUBECONFIG": str(path)})) == ["node-1"]
    # several files, as KUBECONFIG: missing ones are skipped
    assert _nodes(auth_from_params({"kubeconfig": "%s:%s" % (tmp_path / "missing", path)}, {})) == ["node-1"]
    assert [r["authorization"] for r in server.seen] == ["Bearer dict-token", "Bearer env-token", "Bearer env-token"]


def test_no_option_falls_back_to_the_kubeconfig_variable_and_says_so(server, tmp_path, monkeypatch):
    import yaml

    with pytest.raises(KubeClientError) as info:
        _nodes(auth_from_params({}, {}))
    assert "in-cluster service account, else KUBECONFIG or ~/.kube/config is not usable" in str(info.value)
    path = tmp_path / "default-config"
    path.write_text(yaml.safe_dump(_kubeconfig(server.url, "default-token")))
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert _nodes(auth_from_params({}, {})) == ["node-1"]
    assert server.seen[0]["authorization"] == "Bearer default-token"


def test_a_proxy_gets_the_request_and_its_headers(server):
    auth = auth_from_params({"host": "http://kube-api.invalid:6443", "api_key": TOKEN, "proxy": server.url,
                             "proxy_headers": {"proxy_basic_auth": "pu:pp", "user_agent": "metax-test/1"}}, {})
    assert _nodes(auth) == ["node-1"]
    (request,) = server.seen
    assert request["line"].startswith("GET http://kube-api.invalid:6443/api/v1/nodes ")    # the proxy's form
    assert request["proxy_authorization"] == "Basic " + base64.b64encode(b"pu:pp").decode()
    assert request["authorization"] == "Bearer " + TOKEN


def test_no_proxy_goes_around_the_proxy(server):
    closed = "http://127.0.0.1:%d" % free_port()
    auth = auth_from_params({"host": server.url, "api_key": TOKEN, "proxy": closed, "no_proxy": "localhost,127.0.0.1"}, {})
    assert _nodes(auth) == ["node-1"]
    assert server.seen[0]["path"] == "/api/v1/nodes"
    with pytest.raises(kube.KubeConnectionError) as info:
        _nodes(auth_from_params({"host": server.url, "api_key": TOKEN, "proxy": closed}, {}))
    assert server.url in str(info.value) and "api_key" in str(info.value) and TOKEN not in str(info.value)


# ---------------------------------------------------------------------------------------------
# TLS: ca_cert, validate_certs, client_cert and client_key

def _pki(tmp_path) -> Dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(common: str) -> Any:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def issue(subject: str, key: Any, issuer: str, issuer_key: Any, ca: bool, usage: Any = None, san: Any = None) -> Any:
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        else:
            builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                            critical=False)
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    files: Dict[str, str] = {}

    def write(label: str, data: bytes) -> None:
        path = tmp_path / label
        path.write_bytes(data)
        files[label] = str(path)

    def key_pem(key: Any) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _key in range(3))
    ca = issue("h14-ca", ca_key, "h14-ca", ca_key, True)
    server = issue("127.0.0.1", server_key, "h14-ca", ca_key, False, ExtendedKeyUsageOID.SERVER_AUTH,
                   [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client = issue("h14-admin", client_key, "h14-ca", ca_key, False, ExtendedKeyUsageOID.CLIENT_AUTH)
    write("ca.crt", ca.public_bytes(serialization.Encoding.PEM))
    write("server.crt", server.public_bytes(serialization.Encoding.PEM))
    write("server.key", key_pem(server_key))
    write("client.crt", client.public_bytes(serialization.Encoding.PEM))
    write("client.key", key_pem(client_key))
    return files


@pytest.fixture
def tls(tmp_path) -> Iterator[Any]:
    pki = _pki(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["server.crt"], pki["server.key"])
    context.load_verify_locations(pki["ca.crt"])
    context.verify_mode = ssl.CERT_REQUIRED         # mutual TLS: the client certificate is the credential
    srv = _Server(context)
    yield srv, pki
    srv.close()


def test_ca_cert_and_a_client_certificate_authenticate(tls):
    srv, pki = tls
    auth = auth_from_params({"host": srv.url, "ca_cert": pki["ca.crt"], "client_cert": pki["client.crt"],
                             "client_key": pki["client.key"]}, {})
    assert auth.self_sufficient() and _nodes(auth) == ["node-1"]
    assert srv.seen[0]["authorization"] is None      # the certificate, no token


@pytest.mark.filterwarnings("ignore:Unverified HTTPS request")
def test_without_the_ca_the_server_is_not_trusted_unless_validate_certs_is_false(tls):
    srv, pki = tls
    params = {"host": srv.url, "client_cert": pki["client.crt"], "client_key": pki["client.key"]}
    with pytest.raises(kube.KubeConnectionError) as info:
        _nodes(auth_from_params(params, {}))
    assert srv.url in str(info.value) and "\n" not in str(info.value) and "CERTIFICATE_VERIFY_FAILED" in str(info.value)
    assert _nodes(auth_from_params(dict(params, validate_certs=False), {})) == ["node-1"]
    assert _nodes(auth_from_params(params, {"K8S_AUTH_VERIFY_SSL": "no"})) == ["node-1"]
