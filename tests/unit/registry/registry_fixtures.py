"""Real registries for the tests: Debian's docker-registry (Distribution 2.8) on an ephemeral port.

Also: a docker-archive builder (random, incompressible layers) and a TCP
proxy that cuts the first upload connection part-way through a blob.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import tarfile
import shutil
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

import pytest

from ports import free_port


def registry_bin() -> str:
    """Debian's docker-registry on PATH; without it the test skips (and fails under CI: tests/skip_policy.py)."""
    found = shutil.which("docker-registry")
    if found is None:
        pytest.skip("docker-registry not on PATH (Debian package docker-registry, requirements/system.txt)")
    return found


@dataclass
class LocalRegistry:
    host: str
    proc: subprocess.Popen
    root: str
    username: str = ""
    password: str = ""
    ca: Optional[str] = None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_registry(root: str, tls_auth: bool = False) -> LocalRegistry:
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    port = free_port()
    config = ["version: 0.1", "log:", "  level: error", "  accesslog:", "    disabled: true",
              "storage:", "  filesystem:", "    rootdirectory: %s/data" % root, "  delete:", "    enabled: true",
              "http:", "  addr: 127.0.0.1:%d" % port, "  secret: %s" % os.urandom(8).hex()]
    user = password = ""
    ca = None
    if tls_auth:
        user, password = "pusher", os.urandom(8).hex()
        subprocess.run(["htpasswd", "-Bbc", os.path.join(root, "htpasswd"), user, password],
                       check=True, capture_output=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=test registry",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                        "-keyout", os.path.join(root, "tls.key"), "-out", os.path.join(root, "tls.crt")],
                       check=True, capture_output=True)
        ca = os.path.join(root, "tls.crt")
        config += ["  tls:", "    certificate: %s/tls.crt" % root, "    key: %s/tls.key" % root,
                   "auth:", "  htpasswd:", "    realm: test", "    path: %s/htpasswd" % root]
    return _serve(root, config, port, user, password, ca)


def _serve(root: str, config: List[str], port: int, user: str = "", password: str = "",
           ca: Optional[str] = None) -> LocalRegistry:
    """Write the config, start docker-registry and wait for its port."""
    with open(os.path.join(root, "config.yml"), "w") as handle:
        handle.write("\n".join(config) + "\n")
    proc = subprocess.Popen([registry_bin(), "serve", os.path.join(root, "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(root, "log"), "wb"))
    reg = LocalRegistry("127.0.0.1:%d" % port, proc, root, user, password, ca)
    deadline = time.time() + 60          # generous: a loaded CI machine starts it slowly
    while time.time() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return reg
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    reg.stop()
    raise RuntimeError("docker-registry did not start: %s" % open(os.path.join(root, "log")).read())


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def layer_tar(files: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_docker_archive(path: str, ref: str, layers: List[bytes], cmd: Optional[list] = None) -> dict:
    """A `docker save`-shaped archive (legacy layout: <id>/layer.tar); returns its config digest."""
    diff_ids = ["sha256:" + hashlib.sha256(l).hexdigest() for l in layers]
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Cmd": cmd or ["/bin/sh"], "Env": ["PATH=/usr/bin:/bin"]},
              "rootfs": {"type": "layers", "diff_ids": diff_ids}, "history": [{"created_by": "test"}] * len(layers)}
    config_raw = json.dumps(config).encode()
    config_hex = hashlib.sha256(config_raw).hexdigest()
    with tarfile.open(path, "w") as tar:
        names = []
        for i, data in enumerate(layers):
            name = "%s/layer.tar" % diff_ids[i].split(":")[1]
            _add(tar, name, data)
            names.append(name)
        _add(tar, config_hex + ".json", config_raw)
        entry = {"Config": config_hex + ".json", "RepoTags": [ref], "Layers": names}
        _add(tar, "manifest.json", json.dumps([entry]).encode())
    return {"config_digest": "sha256:" + config_hex, "diff_ids": diff_ids}


def random_layers(count: int, size: int, seed: int = 0) -> List[bytes]:
    out = []
    for i in range(count):
        # incompressible and deterministic: a sha256 chain (same seed, same layer)
        block = hashlib.sha256(b"%d-%d" % (seed, i)).digest()
        chunks = []
        for _n in range(size // 32):
            block = hashlib.sha256(block).digest()
            chunks.append(block)
        data = b"".join(chunks)
        out.append(layer_tar({"data/%d.bin" % i: data}))
    return out


class CuttingProxy:
    """Forwards TCP to ``target``; the first connection carrying more than ``cut_after`` bytes upstream is cut."""

    def __init__(self, target_port: int, cut_after: int) -> None:
        self.target_port = target_port
        self.cut_after = cut_after
        self.cuts = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                client, _addr = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src, dst, up: bool) -> None:
        sent = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                sent += len(data)
                if up and self.intercept(data, sent, src, dst):
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def intercept(self, data: bytes, sent: int, src, dst) -> bool:
        """Called for every upstream chunk; True ends the connection."""
        if self.cuts == 0 and sent > self.cut_after:
            self.cuts += 1
            src.shutdown(socket.SHUT_RDWR)
            dst.shutdown(socket.SHUT_RDWR)
            return True
        return False

    def close(self) -> None:
        self.stopped = True
        self.sock.close()


def skopeo_inspect(ref: str, tls_verify: bool = False, creds: str = "", cert_dir: str = "") -> dict:
    cmd = ["skopeo", "inspect", "--raw", "--tls-verify=%s" % str(tls_verify).lower()]
    if creds:
        cmd += ["--creds", creds]
    if cert_dir:
        cmd += ["--cert-dir", cert_dir]
    out = subprocess.run(cmd + ["docker://" + ref], check=True, capture_output=True).stdout
    return {"raw": out, "digest": "sha256:" + hashlib.sha256(out).hexdigest()}


class NoChunkedProxy(CuttingProxy):
    """Like a proxy that demands Content-Length: answers 411 to any request sent with chunked transfer."""

    def __init__(self, target_port: int) -> None:
        self.refused = 0
        super().__init__(target_port, cut_after=1 << 62)

    def intercept(self, data: bytes, sent: int, src, dst) -> bool:
        if b"transfer-encoding: chunked" in data.lower():
            self.refused += 1
            src.sendall(b"HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return True
        return False


class TokenServer:
    """A Docker token service (the bearer flow) for docker-registry's ``auth: token``: JWTs signed RS256 with x5c."""

    def __init__(self, root: str, username: str, password: str, service: str = "test-registry") -> None:
        import base64 as b64
        import datetime
        import http.server
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import padding, rsa
        from cryptography.x509.oid import NameOID

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test token issuer")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        self.cert_path = os.path.join(root, "token.crt")
        os.makedirs(root, exist_ok=True)
        with open(self.cert_path, "wb") as handle:
            handle.write(cert.public_bytes(serialization.Encoding.PEM))
        x5c = b64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self.service = service
        self.issuer = "test-issuer"
        self.requests: List[str] = []
        server = self

        def b64url(data: bytes) -> str:
            return b64.urlsafe_b64encode(data).rstrip(b"=").decode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # noqa: N802 (http.server's name)
                from urllib.parse import parse_qs, urlparse
                query = parse_qs(urlparse(self.path).query)
                expected = "Basic " + b64.b64encode(("%s:%s" % (username, password)).encode()).decode()
                if self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                scopes = query.get("scope", [])
                server.requests.append(" ".join(scopes))
                access = []
                for scope in scopes:
                    kind, repo, actions = scope.split(":")
                    access.append({"type": kind, "name": repo, "actions": actions.split(",")})
                t = int(time.time())
                header = {"typ": "JWT", "alg": "RS256", "x5c": [x5c]}
                claims = {"iss": server.issuer, "sub": username, "aud": server.service, "exp": t + 300,
                          "nbf": t - 10, "iat": t, "jti": os.urandom(8).hex(), "access": access}
                signing = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
                sig = key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
                body = json.dumps({"token": signing + "." + b64url(sig)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = "http://127.0.0.1:%d/token" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def start_token_registry(root: str, username: str, password: str) -> Tuple[LocalRegistry, TokenServer]:
    registry_bin()
    tokens = TokenServer(os.path.join(root, "tokens"), username, password)
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    port = free_port()
    config = ["version: 0.1", "log:", "  level: error", "  accesslog:", "    disabled: true",
              "storage:", "  filesystem:", "    rootdirectory: %s/data" % root,
              "http:", "  addr: 127.0.0.1:%d" % port, "  secret: %s" % os.urandom(8).hex(),
              "auth:", "  token:", "    realm: %s" % tokens.realm, "    service: %s" % tokens.service,
              "    issuer: %s" % tokens.issuer, "    rootcertbundle: %s" % tokens.cert_path]
    try:
        return _serve(root, config, port, username, password), tokens
    except RuntimeError:
        tokens.close()
        raise


# the manual's section 1.4.3: file name -> the name `docker load` gives the image
OLD = ("maca-c500-container-2.23.0.4-ubuntu18.04-amd64.xz", "cr.metax-tech.com/library/maca-c500:2.23.0.4",
       "maca-c500", "2.23.0.4")
NEW = ("mxc500-maca-2.23.0.5-ubuntu20.04-amd64.container.xz", "mxc500-maca:2.23.0.5", "mxc500-maca", "2.23.0.5")


def compressible_layers(count: int, size: int) -> list:
    """Layers that compress like binaries: text and repeated structure with some noise."""
    out = []
    for i in range(count):
        words = [hashlib.sha256(b"%d-%d" % (i, n)).hexdigest()[: 4 + n % 9] for n in range(4096)]
        body = " ".join(words[(n * 7) % 4096] for n in range(size // 8)).encode()[:size]
        out.append(layer_tar({"usr/lib/lib%d.so" % i: body, "etc/conf%d" % i: os.urandom(2048)}))
    return out


def xz_blocks(path: str) -> int:
    out = subprocess.run(["xz", "--robot", "--list", path], check=True, capture_output=True, text=True).stdout
    (totals,) = [l for l in out.splitlines() if l.startswith("totals")]
    return int(totals.split("\t")[2])


def make_xz(tmp_path, file_name: str, ref: str, layers: list, multi_block: bool = True) -> dict:
    tar = str(tmp_path / "image.tar")
    info = make_docker_archive(tar, ref, layers)
    # xz -T0 (what the vendor's tools write) makes a multi-block stream; -T1 one block
    flags = ["-T2", "--block-size=65536"] if multi_block else ["-T1"]
    subprocess.run(["xz", "-1", "-f"] + flags + [tar], check=True)
    path = str(tmp_path / file_name)
    os.replace(tar + ".xz", path)
    assert (xz_blocks(path) > 1) is multi_block
    info["path"] = path
    return info
