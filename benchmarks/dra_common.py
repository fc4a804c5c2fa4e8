# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What the DRA benchmarks (benchmarks/dra_*.py, issue 41) share.

A private control plane -- tests/integration/controlplane.py's etcd,
kube-apiserver and garbage collector, plus a kube-scheduler of our own whose
``/metrics`` we read -- on free ports and a temporary directory (``$TMPDIR``),
never the shared local cluster. No kubelet: a node is a plain Node object
with capacity, its GPUs the ResourceSlice gpu-dra would publish for a
simulated node (our discovery over a simulator host root, then
``dra/slices.py``), the DeviceClasses the Extensions chart renders. The
scheduler allocates the claims and binds the pods itself.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import re
import ssl
import sys
import threading
import time
import urllib.parse
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import scale_common  # noqa: F401  (first: the collection, tests/ and tests/integration on sys.path)

from controlplane import ControlPlane  # noqa: E402
from localcluster import fakenodes  # noqa: E402
from ports import free_port  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.dra import slices as S  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import Inventory  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.names import DRA_DRIVER  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import install_maca  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import NodeSpec  # noqa: E402

NAMESPACE = "dra-bench"
TOKEN = "admin-token"            # controlplane.py's cluster-admin token
GPU_CLASS = "gpu.metax-tech.com"
VF_CLASS = "vf.gpu.metax-tech.com"
RESOURCE = "metax-tech.com/gpu"
ATTR_GROUP = DRA_DRIVER + "/metaxLinkGroup"
ATTR_PF = DRA_DRIVER + "/physicalFunction"
ATTR_NUMA = DRA_DRIVER + "/numaNode"
ATTR_ROOT = S.ATTR_PCIE_ROOT


def machine() -> str:
    """The CPU model and count, memory, and the load now: what the figures were measured on."""
    model = "?"
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo", encoding="utf-8") as fh:
        mem_kib = int(fh.readline().split()[1])
    return "%d x %s, %.0f GiB RAM, load %.2f" % (os.cpu_count() or 0, model, mem_kib / 2 ** 20, os.getloadavg()[0])


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def closing_line(started: float) -> str:
    """The run's length and the machine's load at its end, the last line of every DRA benchmark's table."""
    return "total %.0f s; 1-minute load average at the end %.2f" % (time.monotonic() - started, os.getloadavg()[0])


def write_results(name: str, lines: Sequence[str], figures: Any = None, json_path: Optional[str] = None) -> None:
    """The table to ``results/<name>``, and the figures as JSON to ``json_path`` when asked."""
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, name), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=1)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest rank on the sorted samples (as allocator_bench)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, int(round(pct / 100.0 * (len(ordered) - 1)))))]


def proc_memory(pid: int) -> Dict[str, float]:
    """VmRSS and VmHWM (the peak) of ``pid`` in MiB."""
    out = {}
    with open("/proc/%d/status" % pid, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = round(int(line.split()[1]) / 1024.0, 1)
    return out


# -- the API server ----------------------------------------------------------------------------------------

class TokenClient(fakenodes.ApiClient):
    """fakenodes' small HTTPS client, with the private control plane's bearer token instead of the
    shared cluster's admin certificate (whose PKI it must not read)."""

    def __init__(self, port: int, token: str = TOKEN, timeout: float = 60.0) -> None:  # pylint: disable=super-init-not-called
        self.host, self.port = "127.0.0.1", port
        self.timeout = timeout
        self.context = ssl.create_default_context()
        self.context.check_hostname, self.context.verify_mode = False, ssl.CERT_NONE
        self._local = threading.local()
        self.requests = 0
        self._count_lock = threading.Lock()
        self.token = token

    def _send(self, method, path, data, headers):
        return super()._send(method, path, data, dict(headers, Authorization="Bearer " + self.token))

    def create(self, path: str, obj: Mapping[str, Any]) -> Dict[str, Any]:
        return self.request("POST", path, obj)

    def ensure(self, path: str, obj: Mapping[str, Any]) -> None:
        try:
            self.request("POST", path, obj)
        except fakenodes.ApiError as exc:
            if exc.status != 409:
                raise

    def list_all(self, path: str) -> List[Dict[str, Any]]:
        return list(self.list_pages(path))

    def list_bytes(self, path: str) -> int:
        """The JSON size of the whole list (the objects as the API server serves them)."""
        return sum(len(json.dumps(item, separators=(",", ":"))) for item in self.list_pages(path))


class Scheduler:
    """A kube-scheduler of the control plane's Kubernetes build, default profile, with its metrics
    served on a free port (delegated authentication: the admin token reads them)."""

    def __init__(self, plane: ControlPlane, qps: int = 200, burst: int = 400) -> None:
        self.plane = plane
        self.port = free_port()
        config = os.path.join(plane.dir, "scheduler.json")
        with open(config, "w", encoding="utf-8") as fh:
            json.dump({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                       "clientConnection": {"kubeconfig": plane.kubeconfig, "qps": qps, "burst": burst},
                       "leaderElection": {"leaderElect": False}}, fh)
        self.proc = plane._spawn("kube-scheduler", [  # pylint: disable=protected-access  # stopped with the plane
            os.path.join(plane.bin, "kube-scheduler"), "--config", config, "--secure-port=%d" % self.port,
            "--bind-address=127.0.0.1", "--cert-dir=" + os.path.join(plane.dir, "scheduler-pki"),
            "--authentication-kubeconfig=" + plane.kubeconfig, "--authorization-kubeconfig=" + plane.kubeconfig,
            "--v=1"])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def metrics(self) -> str:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=30)
        try:
            conn.request("GET", "/metrics", headers={"Authorization": "Bearer " + TOKEN})
            resp = conn.getresponse()
            body = resp.read().decode()
            if resp.status != 200:
                raise RuntimeError("scheduler /metrics: HTTP %d %s" % (resp.status, body[:200]))
            return body
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("kube-scheduler exited:\n" + self.plane.log("kube-scheduler"))
            try:
                if "scheduler_" in self.metrics():
                    return
            except (OSError, RuntimeError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("kube-scheduler not ready:\n" + self.plane.log("kube-scheduler"))
            time.sleep(0.5)


class Cluster:
    """The private control plane with (``scheduler=True``) our kube-scheduler; a context manager."""

    def __init__(self, scheduler: bool = True) -> None:
        self.plane = ControlPlane()
        self.with_scheduler = scheduler
        self.scheduler: Optional[Scheduler] = None
        self.client: Optional[TokenClient] = None

    def __enter__(self) -> "Cluster":
        try:
            self.plane.start()
            self.client = TokenClient(self.plane.port)
            self.client.ensure("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": NAMESPACE}})
            # no service-account controller here: the ServiceAccount admission wants the pods' account to exist
            self.client.ensure("/api/v1/namespaces/%s/serviceaccounts" % NAMESPACE, {
                "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
            for item in device_classes():
                self.client.ensure("/apis/resource.k8s.io/v1/deviceclasses", item)
            if self.with_scheduler:
                self.scheduler = Scheduler(self.plane)
                self.scheduler.wait_ready()
        except BaseException:
            self.plane.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.plane.stop()

    @property
    def api(self) -> TokenClient:
        assert self.client is not None
        return self.client

    @property
    def apiserver_pid(self) -> int:
        return next(p.pid for p in self.plane.procs if "kube-apiserver" in str(p.args))

    def version(self) -> str:
        return str(self.api.request("GET", "/version").get("gitVersion"))


def device_classes() -> List[Dict[str, Any]]:
    """The Extensions chart's DeviceClasses with ``dra.enabled`` (helm template: the one definition)."""
    tests_unit = os.path.join(scale_common.REPO, "tests", "unit")
    if tests_unit not in sys.path:
        sys.path.insert(0, tests_unit)
    from charts.helm import find_helm, render  # pylint: disable=import-outside-toplevel
    helm = find_helm()
    if helm is None:
        raise SystemExit("error: helm is needed to render the chart's DeviceClasses (scripts/cluster/build-helm.sh)")
    rc, objects, err = render(helm, {"dra": {"enabled": True}}, extra=["--kube-version", "1.36.3"])
    if rc != 0:
        raise SystemExit("error: helm template failed: " + err)
    classes = [o for o in objects if o.get("kind") == "DeviceClass"]
    names = sorted(o["metadata"]["name"] for o in classes)
    if names != sorted([GPU_CLASS, VF_CLASS]):
        raise SystemExit("error: the chart renders DeviceClasses %s, expected %s and %s" % (names, GPU_CLASS, VF_CLASS))
    return classes


# -- simulated nodes as gpu-dra publishes them ---------------------------------------------------------------

def simulated_inventory(root: str, spec: NodeSpec, vfs: int = 0) -> Inventory:
    """A simulator host root of ``spec`` at ``root`` (``vfs`` VFs per GPU, as driver-config's vfnum sets
    them) read by our discovery: what gpu-dra sees on such a node."""
    if vfs:
        spec = dataclasses.replace(spec, gpus=tuple(dataclasses.replace(g, sriov_totalvfs=max(g.sriov_totalvfs, vfs))
                                                    for g in spec.gpus))
    host = generator.create(root, spec)
    install_maca(host, spec.maca_version)
    if vfs:
        for pf_dir in sorted(generator.gpu_sysfs_dirs(host).values()):
            generator.set_numvfs(host, pf_dir, vfs)
    return discover(host)


def node_slices(node: str, inventory: Inventory) -> List[Dict[str, Any]]:
    """The ResourceSlices gpu-dra creates for ``node`` on its first publication (slices.plan against none)."""
    return S.plan(node, S.build_devices(inventory), []).create


def node_manifest(name: str, gpus: int = 0, labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """A Node without a kubelet: capacity only (``gpus``: the device plugin's ``metax-tech.com/gpu``)."""
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110"}
    if gpus:
        resources[RESOURCE] = str(gpus)
    meta_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    meta_labels.update(labels or {})
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": meta_labels},
            "status": {"capacity": dict(resources), "allocatable": dict(resources),
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "no kubelet: a benchmark node"}]}}


def create_node(api: TokenClient, manifest: Mapping[str, Any]) -> None:
    """Create the Node and drop the ``node.kubernetes.io/not-ready`` taint the API server's
    TaintNodesByCondition admission puts on every new Node (the node lifecycle controller, not run
    here, would remove it once the Ready condition is seen)."""
    api.create("/api/v1/nodes", manifest)
    api.request("PATCH", "/api/v1/nodes/" + manifest["metadata"]["name"], {"spec": {"taints": None}},
                "application/merge-patch+json")


def device_request(name: str, count: int, device_class: str = GPU_CLASS, cel: Optional[str] = None) -> Dict[str, Any]:
    exactly: Dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {"name": name, "exactly": exactly}


def prioritized_request(name: str, count: int, attributes: Sequence[Optional[str]], device_class: str = GPU_CLASS,
                        also: Sequence[str] = ()) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """One request whose ``firstAvailable`` subrequests (``t0``, ``t1``...) ask the same devices under
    ``matchAttribute`` on each of ``attributes`` in turn (None: no constraint), and the constraints;
    ``also``: other requests of the claim each constraint covers too. The scheduler takes the first
    subrequest it can satisfy (DRAPrioritizedList)."""
    subrequests, constraints = [], []
    for i, attribute in enumerate(attributes):
        sub = "t%d" % i
        subrequests.append({"name": sub, "deviceClassName": device_class, "allocationMode": "ExactCount",
                            "count": count})
        if attribute:
            constraints.append({"requests": list(also) + ["%s/%s" % (name, sub)], "matchAttribute": attribute})
    return {"name": name, "firstAvailable": subrequests}, constraints


def claim_manifest(name: str, requests: Sequence[Dict[str, Any]], match: Optional[str] = None,
                   labels: Optional[Mapping[str, str]] = None,
                   constraints: Sequence[Dict[str, Any]] = ()) -> Dict[str, Any]:
    """A ResourceClaim; ``match``: one ``matchAttribute`` constraint over all its requests (else
    ``constraints`` as given)."""
    devices: Dict[str, Any] = {"requests": list(requests)}
    if match:
        devices["constraints"] = [{"requests": [r["name"] for r in requests], "matchAttribute": match}]
    elif constraints:
        devices["constraints"] = list(constraints)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(labels or {})},
            "spec": {"devices": devices}}


def claims_path() -> str:
    return "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims" % NAMESPACE


def pods_path() -> str:
    return "/api/v1/namespaces/%s/pods" % NAMESPACE


def hold_devices(api: TokenClient, name: str, node: str, devices: Sequence[str],
                 device_class: str = GPU_CLASS) -> None:
    """A claim already allocated ``devices`` of ``node``'s pool (the GPUs earlier pods hold): its status
    written as the scheduler writes it, so the scheduler counts them as in use."""
    api.create(claims_path(), claim_manifest(name, [device_request("held", len(devices), device_class)]))
    path = "%s/%s/status" % (claims_path(), name)
    current = api.request("GET", path)
    current["status"] = {"allocation": {
        "devices": {"results": [{"request": "held", "driver": DRA_DRIVER, "pool": node, "device": dev}
                                for dev in devices]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    api.request("PUT", path, current)


def pod_manifest(name: str, node: Optional[str] = None, claim: Optional[str] = None, gpus: int = 0,
                 labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """A pod for the scheduler: ``claim`` (a ResourceClaim's name) or ``gpus`` of the extended resource;
    ``node``: pinned by the hostname label (the scheduler still filters and allocates)."""
    container: Dict[str, Any] = {"name": "train", "image": "registry.invalid/train:1",
                                 "resources": {"requests": {"cpu": "100m"}}}
    spec: Dict[str, Any] = {"containers": [container], "automountServiceAccountToken": False,
                            "terminationGracePeriodSeconds": 0}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if claim:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
        container["resources"]["claims"] = [{"name": "gpus"}]
    if gpus:
        container["resources"]["limits"] = {RESOURCE: str(gpus)}
        container["resources"]["requests"][RESOURCE] = str(gpus)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(labels or {})}, "spec": spec}


def allocation_results(claim: Mapping[str, Any]) -> List[Dict[str, Any]]:
    return ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or [])


def allocated_devices(claim: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """(pool, device) of a claim's allocation, in the scheduler's order."""
    return [(str(r.get("pool")), str(r.get("device"))) for r in allocation_results(claim)]


def delete_now(api: TokenClient, path: str) -> None:
    """Delete at once (no kubelet confirms a pod's end; no resourceclaim controller drops a claim's
    finalizer): finalizers cleared, grace period 0."""
    try:
        current = api.request("GET", path)
        if (current.get("metadata") or {}).get("finalizers"):
            api.request("PATCH", path, {"metadata": {"finalizers": None}}, "application/merge-patch+json")
        api.request("DELETE", path + "?gracePeriodSeconds=0")
    except fakenodes.ApiError as exc:
        if exc.status != 404:
            raise


class PodWatch:
    """One watch on the benchmark namespace's pods: when each got its node, or the scheduler's
    Unschedulable condition."""

    def __init__(self, api: TokenClient) -> None:
        self.api = api
        self.bound: Dict[str, Tuple[float, str]] = {}
        self.unschedulable: Dict[str, str] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._rv = api.request("GET", pods_path() + "?limit=1")["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True, name="pod-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            conn = http.client.HTTPSConnection(self.api.host, self.api.port, context=self.api.context, timeout=5)
            try:
                conn.request("GET", "%s?%s" % (pods_path(), urllib.parse.urlencode(dict(
                    watch="1", resourceVersion=self._rv, allowWatchBookmarks="true", timeoutSeconds="120"))),
                    headers={"Authorization": "Bearer " + self.api.token})
                resp = conn.getresponse()
                while not self._stop:
                    line = resp.readline()
                    if not line:
                        break
                    self._seen(json.loads(line))
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(0.1)
            finally:
                conn.close()

    def _seen(self, event: Dict[str, Any]) -> None:
        now = time.monotonic()
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        self._rv = meta.get("resourceVersion") or self._rv
        name = meta.get("name")
        if not name or event.get("type") not in ("ADDED", "MODIFIED"):
            return
        node = (obj.get("spec") or {}).get("nodeName")
        with self._cond:
            if node and name not in self.bound:
                self.bound[name] = (now, node)
            for cond in (obj.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                        and cond.get("reason") == "Unschedulable":
                    self.unschedulable[name] = str(cond.get("message"))
            self._cond.notify_all()

    def wait(self, name: str, timeout: float = 60.0, settle: float = 0.0) -> Tuple[str, Any]:
        """("bound", (monotonic time, node)) or ("unschedulable", the scheduler's message); TimeoutError.

        ``settle``: seconds to wait on for a binding after the scheduler said Unschedulable (a pool of
        several slices seen in part: the scheduler tries again when the rest arrives)."""
        deadline = time.monotonic() + timeout
        refused: Optional[float] = None
        with self._cond:
            while True:
                if name in self.bound:
                    return "bound", self.bound[name]
                if name in self.unschedulable:
                    refused = time.monotonic() if refused is None else refused
                    if time.monotonic() - refused >= settle:
                        return "unschedulable", self.unschedulable[name]
                    deadline = min(deadline, refused + settle)
                left = deadline - time.monotonic()
                if refused is not None and left <= 0:
                    return "unschedulable", self.unschedulable[name]
                if left <= 0:
                    raise TimeoutError("pod %s neither bound nor unschedulable after %.0f s" % (name, timeout))
                self._cond.wait(left)

    def stop(self) -> None:
        self._stop = True
        self._thread.join(timeout=10)


# -- the scheduler's histograms -------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)$')


def samples(text: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    out = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")))
            out[(match.group(1), labels)] = float(match.group(3))
    return out


@dataclasses.dataclass(frozen=True)
class Histogram:
    count: int
    mean_ms: float
    p50_ms: float
    p99_ms: float

    def row(self) -> str:
        return "%5d %8.2f %8.2f %8.2f" % (self.count, self.mean_ms, self.p50_ms, self.p99_ms)


def histogram(after: str, before: str, name: str, match: Mapping[str, str]) -> Histogram:
    """The series of ``name`` whose labels include ``match``, summed, ``before`` subtracted; p50/p99
    interpolated inside the buckets (as Prometheus' histogram_quantile)."""
    now, then = samples(after), samples(before)

    def total(metric: str, extra: Optional[Tuple[str, str]] = None) -> Dict[str, float]:
        sums: Dict[str, float] = {}
        for (metric_name, labels), value in now.items():
            if metric_name != metric:
                continue
            lab = dict(labels)
            if any(lab.get(k) != v for k, v in match.items()):
                continue
            key = lab.get(extra[0], "") if extra else ""
            sums[key] = sums.get(key, 0.0) + value - then.get((metric_name, labels), 0.0)
        return sums

    buckets = sorted((float("inf") if le == "+Inf" else float(le), c)
                     for le, c in total(name + "_bucket", ("le", "")).items())
    count = sum(total(name + "_count").values())
    seconds = sum(total(name + "_sum").values())
    if not count:
        return Histogram(0, float("nan"), float("nan"), float("nan"))

    def quantile(q: float) -> float:
        rank, lower, seen = q * count, 0.0, 0.0
        for bound, cumulative in buckets:
            if cumulative >= rank:
                if bound == float("inf"):
                    return lower * 1000
                share = (rank - seen) / (cumulative - seen) if cumulative > seen else 1.0
                return (lower + (bound - lower) * share) * 1000
            lower, seen = bound, cumulative
        return lower * 1000

    return Histogram(int(count), seconds / count * 1000, quantile(0.5), quantile(0.99))
