# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The scale profile's fake GPU nodes: their Node objects and the writer that keeps what our agents publish.

A fake node has no host, so it carries what gpu-label and gpu-device would
publish on a real one -- labels, annotations and ``metax-tech.com/gpu``
capacity -- given as :class:`GpuProfile` values. This package is standard
library only, so the profiles are computed outside it by our own discovery and
allocator over simulated roots (tests/scale/agent_output.py) and passed in.

Every fake node is labelled ``type=kwok`` (what kwok manages) and tainted
``kwok.x-k8s.io/node=fake:NoSchedule``, kwok's usual taint: no DaemonSet of
the shared cluster lands there; the scale benchmarks' pods tolerate it.

:class:`Writer` publishes at the agents' rate: every ``interval`` (gpu-label's
60 s) it lists the fake nodes and patches a node only where its
``metax-tech.com/`` labels or annotations differ from what the agents would
write -- so at steady state it writes nothing, like the agents.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple

from .settings import Settings

FAKE_LABEL = ("type", "kwok")
SELECTOR = "%s=%s" % FAKE_LABEL
PRESET_LABEL = "scale.metax-tech.com/preset"
TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"], "effect": "NoSchedule"}
OWNED_PREFIX = "metax-tech.com/"
RESOURCE = "metax-tech.com/gpu"
NAME_PREFIX = "kwok-gpu-"
AGENT_INTERVAL = 60.0   # gpu-label's DEFAULT_INTERVAL


@dataclass(frozen=True)
class GpuProfile:
    """What the agents publish on a node of one preset in one allocation state."""

    preset: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    capacity: int                       # metax-tech.com/gpu


@dataclass(frozen=True)
class FakeNode:
    name: str
    profile: GpuProfile


def plan(count: int, profiles: Sequence[GpuProfile], prefix: str = NAME_PREFIX) -> list[FakeNode]:
    """``count`` nodes, the profiles taken in turn (a mixed fleet), names sortable by index."""
    if not profiles:
        raise ValueError("no GPU profiles")
    return [FakeNode("%s%05d" % (prefix, i), profiles[i % len(profiles)]) for i in range(count)]


def node_manifest(node: FakeNode) -> Dict[str, Any]:
    p = node.profile
    labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "kubernetes.io/role": "agent", "node-role.kubernetes.io/agent": "", FAKE_LABEL[0]: FAKE_LABEL[1],
              PRESET_LABEL: p.preset}
    labels.update(p.labels)
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", RESOURCE: str(p.capacity)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node.name, "labels": labels,
                     "annotations": dict(p.annotations, **{"kwok.x-k8s.io/node": "fake",
                                                           "node.alpha.kubernetes.io/ttl": "0"})},
        "spec": {"taints": [dict(TAINT)]},
        # kwok's node-initialize stage keeps capacity/allocatable and fills the rest.
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def owned_changes(current: Mapping[str, str], desired: Mapping[str, str]) -> Dict[str, Optional[str]]:
    """The merge-patch map bringing ``current``'s ``metax-tech.com/`` keys to ``desired`` ({} when equal)."""
    patch: Dict[str, Optional[str]] = {k: v for k, v in desired.items() if current.get(k) != v}
    for key in current:
        if key.startswith(OWNED_PREFIX) and key not in desired:
            patch[key] = None
    return patch


class ApiError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__("HTTP %d: %s" % (status, text[:300]))
        self.status = status


TRANSIENT_PAUSES = (1.0, 2.0, 4.0, 8.0, 0.0)   # seconds before each retry; the last answer stands


def _transient(status: int, raw: bytes) -> bool:
    """An answer worth sending the request again for: load shed, or etcd timing out under the apiserver."""
    return status in (429, 503) or (status == 500 and b"etcdserver: request timed out" in raw)


class ApiClient:
    """A small HTTPS client of the local apiserver with the admin certificate (one connection per thread)."""

    def __init__(self, settings: Settings, timeout: float = 60.0) -> None:
        url = urllib.parse.urlsplit(settings.apiserver)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=settings.pki + "/ca.crt")
        self.context.load_cert_chain(settings.pki + "/admin.crt", settings.pki + "/admin.key")
        self._local = threading.local()
        self.requests = 0
        self._count_lock = threading.Lock()

    def _conn(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPSConnection(self.host, self.port, context=self.context,
                                                                  timeout=self.timeout)
        return conn

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        with self._count_lock:
            self.requests += 1
        for pause in TRANSIENT_PAUSES:
            status, raw = self._send(method, path, data, headers)
            if not _transient(status, raw):
                break
            # etcd stalled (its fsync behind a burst of disk writes) or the apiserver shed load: what a
            # client retries; a create that was committed anyway comes back as 409, which callers accept
            time.sleep(pause)
        if status >= 300:
            raise ApiError(status, raw.decode(errors="replace"))
        return json.loads(raw) if raw else None

    def _send(self, method: str, path: str, data: Optional[bytes], headers: Dict[str, str]) -> Tuple[int, bytes]:
        try:
            return self._exchange(method, path, data, headers)
        except (http.client.HTTPException, OSError):
            # a kept-alive connection the server had closed: once more, on a new one
            return self._exchange(method, path, data, headers)

    def _exchange(self, method: str, path: str, data: Optional[bytes], headers: Dict[str, str]) -> Tuple[int, bytes]:
        conn = self._conn()
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (http.client.HTTPException, OSError):
            conn.close()
            self._local.conn = None
            raise

    def list_pages(self, path: str, selector: str = "", limit: int = 500) -> Iterator[Dict[str, Any]]:
        """Every item of a list, ``limit`` at a time (continue tokens: no one-call list of 2,000 nodes)."""
        token = ""
        while True:
            query = {"limit": str(limit)}
            if selector:
                query["labelSelector"] = selector
            if token:
                query["continue"] = token
            page = self.request("GET", path + "?" + urllib.parse.urlencode(query))
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return


def _parallel(func: Callable[[Any], Any], items: Sequence[Any], workers: int) -> list[Any]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(func, items))


def create(client: ApiClient, nodes: Sequence[FakeNode], workers: int = 8) -> int:
    """Create the nodes (existing ones are left as they are); returns how many were created."""
    def one(node: FakeNode) -> int:
        try:
            client.request("POST", "/api/v1/nodes", node_manifest(node))
            return 1
        except ApiError as exc:
            if exc.status == 409:
                return 0
            raise
    return sum(_parallel(one, nodes, workers))


def names(client: ApiClient) -> list[str]:
    return [n["metadata"]["name"] for n in client.list_pages("/api/v1/nodes", SELECTOR)]


def delete_collection(client: ApiClient, path: str, selector: str = "", timeout: float = 300.0) -> None:
    """DELETE a collection and wait until it is empty.

    On a loaded machine the apiserver answers a deletecollection of 1,000 objects with 504 after its
    60 s request timeout while it goes on deleting; the DELETE is then sent again until nothing is left.
    """
    query = {"gracePeriodSeconds": "0"}
    if selector:
        query["labelSelector"] = selector
    probe = dict(query, limit="1")
    del probe["gracePeriodSeconds"]
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.request("DELETE", path + "?" + urllib.parse.urlencode(query))
        except ApiError as exc:
            if exc.status != 504:
                raise
        for _poll in range(10):
            if not client.request("GET", path + "?" + urllib.parse.urlencode(probe)).get("items"):
                return
            if time.monotonic() > deadline:
                raise TimeoutError("%s still has objects after %.0f s" % (path, timeout))
            time.sleep(1.0)


def delete_all(client: ApiClient) -> int:
    """Delete every fake node (by the label: also those of an earlier, interrupted run)."""
    found = names(client)
    if found:
        delete_collection(client, "/api/v1/nodes", SELECTOR)
    return len(found)


def wait_ready(client: ApiClient, count: int, timeout: float) -> float:
    """Seconds until ``count`` fake nodes report Ready (kwok's node-initialize stage)."""
    start = time.monotonic()
    while True:
        ready = 0
        for node in client.list_pages("/api/v1/nodes", SELECTOR):
            for cond in (node.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    ready += 1
        if ready >= count:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError("%d of %d fake nodes Ready after %.0f s" % (ready, count, timeout))
        time.sleep(1.0)


@dataclass
class Writer:
    """The agents' output on every fake node, kept up at their rate (a thread; test code only)."""

    client: ApiClient
    desired: Dict[str, GpuProfile]                   # node name -> what the agents publish now
    interval: float = AGENT_INTERVAL
    writes: int = 0
    rounds: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None

    def sync(self) -> int:
        """One round over every fake node; returns the patches written."""
        written = 0
        for node in self.client.list_pages("/api/v1/nodes", SELECTOR):
            meta = node["metadata"]
            profile = self.desired.get(meta["name"])
            if profile is None:
                continue
            labels = owned_changes(meta.get("labels") or {}, profile.labels)
            annotations = owned_changes(meta.get("annotations") or {}, profile.annotations)
            patch: Dict[str, Any] = {}
            if labels:
                patch["labels"] = labels
            if annotations:
                patch["annotations"] = annotations
            if patch:
                self.client.request("PATCH", "/api/v1/nodes/" + meta["name"], {"metadata": patch},
                                    content_type="application/merge-patch+json")
                written += 1
        self.writes += written
        self.rounds += 1
        return written

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except (ApiError, OSError, http.client.HTTPException):
                continue   # the agents back off and keep running; so does the writer

    def start(self) -> "Writer":
        self._thread = threading.Thread(target=self._run, name="fake-agents", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def profile_map(nodes: Sequence[FakeNode]) -> Dict[str, GpuProfile]:
    return {n.name: n.profile for n in nodes}


def counts_by_preset(nodes: Sequence[FakeNode]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for n in nodes:
        out[n.profile.preset] = out.get(n.profile.preset, 0) + 1
    return out


def gpu_totals(nodes: Sequence[FakeNode]) -> Tuple[int, int]:
    """(nodes, GPUs) of the fleet."""
    return len(nodes), sum(n.profile.capacity for n in nodes)
