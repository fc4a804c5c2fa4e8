# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Helpers for the gpu-aware tests and benchmarks/extender_bench.py.

* :func:`make_node`: a Node object the size and shape of a real one (labels
  incl. the gpu-label set and Node Feature Discovery's, kubelet's image list,
  conditions, addresses) carrying gpu-device's annotations, with tables
  computed by the real allocator;
* :func:`extender_args`: an ExtenderArgs body encoded as kube-scheduler does
  (compact JSON, field order Pod, Nodes, NodeNames);
* :class:`FakeApiServer`: just enough of the Kubernetes API (list and watch
  of nodes and ConfigMaps, resourceVersions, 410 Gone, injected failures) to
  run gpu-aware's reflector and the real ``kubernetes`` client against.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import (
    ANNOTATION_DEVICES, ANNOTATION_LOSSES, ANNOTATION_SCORES)

GPU = "metax-tech.com/gpu"
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

_TABLES: Dict[Tuple[int, ...], Tuple[Dict[int, int], Dict[int, int]]] = {}


def tables(free: Sequence[int], preset_name: str = "8xC500") -> Tuple[Dict[int, int], Dict[int, int]]:
    """(scores, losses) of the real allocator for free devices of a simulator preset."""
    key = (hash(preset_name),) + tuple(sorted(free))
    if key not in _TABLES:
        from ansible_collections.metax.gpu.plugins.module_utils.sim.alloc_synth import topology_from_spec
        from ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator import per_count_tables
        from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset
        _TABLES[key] = per_count_tables(topology_from_spec(preset(preset_name)), sorted(free))
    return _TABLES[key]


def annotations(devices: int = 8, allocated: Sequence[int] = (), unhealthy: Sequence[int] = (),
                with_tables: bool = True) -> Dict[str, str]:
    """gpu-device's three annotations for an 8xC500-like node."""
    entries = []
    for index in range(devices):
        bdf = "0000:%02x:00.0" % (0x0b + index * 0x10)
        entries.append({"id": bdf, "index": index, "bdf": bdf,
                        "uuid": "GPU-%08x-0000-4000-8000-%012x" % (index * 2654435761 % 2 ** 32, index),
                        "numa": index // 4, "link_group": index // 4,
                        "health": "Unhealthy" if index in unhealthy else "Healthy",
                        "allocated": index in allocated})
    out = {ANNOTATION_DEVICES: json.dumps(entries, separators=(",", ":"))}
    if with_tables:
        free = [i for i in range(devices) if i not in allocated and i not in unhealthy]
        if devices == 8:
            scores, losses = tables(free)
        else:
            scores = {n: 800 - 10 * n for n in range(1, len(free) + 1)}
            losses = {n: 10 * (len(free) - n) for n in range(1, len(free) + 1)}
        out[ANNOTATION_SCORES] = json.dumps({str(k): v for k, v in sorted(scores.items())}, separators=(",", ":"))
        out[ANNOTATION_LOSSES] = json.dumps({str(k): v for k, v in sorted(losses.items())}, separators=(",", ":"))
    return out


def make_node(index: int, rng: Optional[random.Random] = None, devices: int = 8,
              allocated: Optional[Sequence[int]] = None, images: int = 40,
              gpu_annotations: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """A realistic GPU Node (about 13 KB of JSON) named ``gpu-node-<index>``."""
    rng = rng or random.Random(index)
    if allocated is None:
        allocated = sorted(rng.sample(range(devices), rng.choice((0, 0, 1, 2, 4, 6, 7, 8))))
    name = "gpu-node-%05d" % index
    zone = "zone-%s" % "abc"[index % 3]
    labels = {
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "gpu.8xc500.2xlarge",
        "topology.kubernetes.io/region": "cn-north-1", "topology.kubernetes.io/zone": zone,
        "metax-tech.com/gpu.installed": "true", "metax-tech.com/driver.ready": "true",
        "metax-tech.com/gpu.driver.major": "2", "metax-tech.com/gpu.driver.minor": "31",
        "metax-tech.com/gpu.driver.patch": "4", "metax-tech.com/gpu.driver.mode": "native",
        "metax-tech.com/gpu.family": "MXC", "metax-tech.com/gpu.memory": "64GB",
        "metax-tech.com/gpu.product": "MXC500", "metax-tech.com/gpu.sriov": "off", "metax-tech.com/gpu.vfnum": "0",
    }
    for feature in ("cpu-cpuid.AVX512F", "cpu-cpuid.AVX512BW", "cpu-cpuid.AMXBF16", "cpu-hardware_multithreading",
                    "cpu-model.family", "cpu-model.id", "cpu-model.vendor_id", "kernel-version.full",
                    "kernel-version.major", "memory-numa", "network-sriov.capable", "pci-1d82.present",
                    "storage-nonrotationaldisk", "system-os_release.ID", "system-os_release.VERSION_ID"):
        labels["feature.node.kubernetes.io/" + feature] = "true"
    annots = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": json.dumps({"csi.tigera.io": name, "disk.csi.example.com": "i-%08x" %
                                                       index}),
        "projectcalico.org/IPv4Address": "10.%d.%d.%d/16" % (index // 65536 % 256, index // 256 % 256, index % 256),
        "nfd.node.kubernetes.io/feature-labels": ",".join(sorted(k.split("/", 1)[1] for k in labels
                                                                 if k.startswith("feature."))),
    }
    annots.update(gpu_annotations if gpu_annotations is not None else annotations(devices, allocated))
    image_list = []
    for i in range(images):
        repo = "registry.example.com/%s/%s" % (rng.choice(("ai", "infra", "library", "metax")), "image-%02d" % i)
        digest = "%064x" % rng.getrandbits(256)
        image_list.append({"names": ["%s@sha256:%s" % (repo, digest), "%s:v%d.%d.%d" % (repo, i % 3, i % 7, i)],
                           "sizeBytes": rng.randint(10 ** 6, 6 * 10 ** 9)})
    address = "10.%d.%d.%d" % (index // 65536 % 256, index // 256 % 256, index % 256)
    stamp = "2026-11-%02dT%02d:%02d:%02dZ" % (1 + index % 28, index % 24, index % 60, (index * 7) % 60)
    conditions = [{"type": t, "status": s, "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
                   "reason": r, "message": m} for t, s, r, m in (
        ("NetworkUnavailable", "False", "CalicoIsUp", "Calico is running on this node"),
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"))]
    resources = {"cpu": "128", "ephemeral-storage": "1887507400Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                 "memory": "1056434012Ki", "pods": "110", GPU: str(devices)}
    return {
        "metadata": {"name": name, "uid": "%08x-0000-4000-8000-%012x" % (index, index),
                     "resourceVersion": str(100000 + index), "creationTimestamp": stamp,
                     "labels": labels, "annotations": annots},
        "spec": {"podCIDR": "10.244.%d.0/24" % (index % 256), "podCIDRs": ["10.244.%d.0/24" % (index % 256)],
                 "providerID": "example://cn-north-1/%s/i-%08x" % (zone, index)},
        "status": {
            "capacity": dict(resources), "allocatable": dict(resources, cpu="127600m", memory="1045948252Ki"),
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "%032x" % index, "systemUUID": "%032x" % (index + 1),
                         "bootID": "%032x" % (index + 2), "kernelVersion": "5.15.0-125-generic",
                         "osImage": "Ubuntu 22.04.5 LTS", "containerRuntimeVersion": "containerd://1.7.24",
                         "kubeletVersion": "v1.36.3", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": image_list,
        },
    }


def load_fixture(name: str) -> bytes:
    with open(os.path.join(FIXTURES, name), "rb") as handle:
        return handle.read()


def captured_pod() -> Dict[str, Any]:
    """The Pod of the captured kube-scheduler request (init 1 device, container 2)."""
    return json.loads(load_fixture("kube-scheduler-1.36-nodes.json"))["Pod"]


def gpu_pod(demand: int, name: str = "train") -> Dict[str, Any]:
    pod = captured_pod()
    pod["metadata"]["name"] = name
    pod["spec"]["initContainers"] = []
    for container in pod["spec"]["containers"]:
        container["resources"] = {"limits": {GPU: str(demand)}, "requests": {GPU: str(demand)}}
    return pod


def extender_args(pod: Dict[str, Any], nodes: Optional[List[Dict[str, Any]]] = None,
                  names: Optional[List[str]] = None) -> bytes:
    """ExtenderArgs as kube-scheduler encodes them (Go encoding/json: compact, struct field order)."""
    if names is not None:
        document: Dict[str, Any] = {"Pod": pod, "Nodes": None, "NodeNames": names}
    else:
        document = {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes or []}, "NodeNames": None}
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


# ------------------------------------------------------------ fake API server

class FakeApiServer:
    """Lists and watches of nodes and ConfigMaps over HTTP, like kube-apiserver.

    ``set(kind, obj)`` / ``delete(kind, name)`` change state and emit watch
    events; ``compact()`` makes every resourceVersion so far answer 410;
    ``fail_next(n)`` answers the next n requests with HTTP 500.
    """

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.version = 1000
        self.compacted = -1
        self.objects: Dict[str, Dict[str, Dict[str, Any]]] = {"nodes": {}, "configmaps": {}}
        self.events: List[Tuple[int, str, str, Dict[str, Any]]] = []
        self.requests: List[str] = []
        self.failures = 0
        self.closed = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                server._get(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                       daemon=True)

    # ---------------------------------------------------------------- control
    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def start(self) -> "FakeApiServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path: str) -> str:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                  "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                  "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                  "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        return path

    def set(self, kind: str, obj: Dict[str, Any], emit: bool = True) -> None:
        with self.lock:
            self.version += 1
            obj = json.loads(json.dumps(obj))
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
            name = obj["metadata"]["name"]
            existed = name in self.objects[kind]
            self.objects[kind][name] = obj
            if emit:
                self.events.append((self.version, kind, "MODIFIED" if existed else "ADDED", obj))
            self.lock.notify_all()

    def delete(self, kind: str, name: str) -> None:
        with self.lock:
            self.version += 1
            obj = self.objects[kind].pop(name)
            obj = dict(obj, metadata=dict(obj["metadata"], resourceVersion=str(self.version)))
            self.events.append((self.version, kind, "DELETED", obj))
            self.lock.notify_all()

    def compact(self) -> None:
        """Every resourceVersion handed out so far becomes too old (watches end with 410)."""
        with self.lock:
            self.version += 1
            self.compacted = self.version - 1
            self.lock.notify_all()

    def fail_next(self, count: int) -> None:
        with self.lock:
            self.failures = count

    def count(self, prefix: str) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r.startswith(prefix))

    # ---------------------------------------------------------------- serving
    @staticmethod
    def _send_json(handler: BaseHTTPRequestHandler, code: int, document: Any) -> None:
        body = json.dumps(document).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _get(self, handler: BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(handler.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        parts = parsed.path.strip("/").split("/")
        if parts[:2] != ["api", "v1"]:
            return self._send_json(handler, 404, {"kind": "Status", "code": 404})
        kind = parts[-1]
        namespace = parts[3] if len(parts) == 5 and parts[2] == "namespaces" else None
        if kind not in self.objects:
            return self._send_json(handler, 404, {"kind": "Status", "code": 404})
        watch = query.get("watch") in ("true", "1")
        with self.lock:
            self.requests.append("%s %s" % ("watch" if watch else "list", kind))
            if self.failures > 0:
                self.failures -= 1
                fail = True
            else:
                fail = False
        if fail:
            return self._send_json(handler, 500, {"kind": "Status", "code": 500, "message": "injected failure"})
        selector = query.get("fieldSelector", "")
        wanted = selector.split("=", 1)[1] if selector.startswith("metadata.name=") else None

        def matches(obj: Dict[str, Any]) -> bool:
            metadata = obj.get("metadata", {})
            if wanted is not None and metadata.get("name") != wanted:
                return False
            return namespace is None or metadata.get("namespace", namespace) == namespace

        if not watch:
            # limit/continue as the apiserver pages a list: the continue token carries the snapshot's
            # resourceVersion and where the next page starts (here: the snapshot is not kept, the
            # objects are read in name order from the token's offset).
            limit = int(query.get("limit") or 0)
            token = query.get("continue")
            with self.lock:
                items = sorted((o for o in self.objects[kind].values() if matches(o)),
                               key=lambda o: o["metadata"]["name"])
                version = self.version
            metadata = {"resourceVersion": str(version)}
            if token:
                version_text, start_text = token.split(":")
                metadata["resourceVersion"] = version_text
                items = items[int(start_text):]
                start = int(start_text)
            else:
                start = 0
            if limit and len(items) > limit:
                items = items[:limit]
                metadata["continue"] = "%s:%d" % (metadata["resourceVersion"], start + limit)
            return self._send_json(handler, 200, {"kind": "List", "apiVersion": "v1", "metadata": metadata,
                                                  "items": items})
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def chunk(document: Dict[str, Any]) -> None:
            data = json.dumps(document).encode() + b"\n"
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        try:
            while True:
                with self.lock:
                    if since <= self.compacted:
                        pending: List[Dict[str, Any]] = [{"type": "ERROR", "object": {
                            "kind": "Status", "code": 410, "reason": "Expired",
                            "message": "too old resource version: %d (%d)" % (since, self.compacted)}}]
                        done = True
                    else:
                        pending = [{"type": t, "object": o} for v, k, t, o in self.events
                                   if k == kind and v > since and matches(o)]
                        since = max([since] + [event[0] for event in self.events if event[1] == kind])
                        done = False
                    if not pending and not done:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0 or self.closed:
                            break
                        self.lock.wait(min(remaining, 0.5))
                        continue
                for event in pending:
                    chunk(event)
                if done:
                    break
            handler.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass
        handler.close_connection = True
