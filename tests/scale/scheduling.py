# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The real kube-scheduler choosing among the fake GPU nodes, with and without gpu-aware.

A second kube-scheduler runs on the host beside the cluster's own, under its
own scheduler name (so the cluster's scheduler never takes these pods), with
the admin kubeconfig and no leader election. gpu-aware runs as a host process
in cache mode (``nodeCacheCapable: true``: its node cache is filled by
list+watch from the same apiserver). The GPU pods tolerate kwok's taint and
select the fake nodes; a watch records when each is bound.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from localcluster import fakenodes
from ports import free_port
from localcluster.settings import Settings

SCHEDULER_NAME = "metax-scale-scheduler"
NAMESPACE = "metax-scale-bench"
AGENT = "ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_aware"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def k8s_bin_dir(settings: Settings) -> str:
    """The newest complete Kubernetes build of the pinned version in the cache (whatever Go built it)."""
    base = os.path.join(settings.cache_dir, "k8s")
    for name in sorted(os.listdir(base), reverse=True):
        if name.startswith(settings.kube_version + "-") and os.path.isfile(os.path.join(base, name, ".complete")):
            return os.path.join(base, name, "bin")
    raise FileNotFoundError("no complete Kubernetes %s build under %s" % (settings.kube_version, base))


def rss_kib(pid: int) -> Dict[str, int]:
    out = {}
    with open("/proc/%d/status" % pid, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def scheduler_config(kubeconfig: str, extender_port: Optional[int]) -> str:
    doc: Dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig, "qps": 200, "burst": 400},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
    }
    if extender_port is not None:
        # As metax.gpu.scheduler_extender configures it: cache mode, GPU pods only.
        doc["extenders"] = [{
            "urlPrefix": "http://127.0.0.1:%d" % extender_port, "filterVerb": "filter",
            "prioritizeVerb": "prioritize", "weight": 1, "nodeCacheCapable": True, "enableHTTPS": False,
            "managedResources": [{"name": fakenodes.RESOURCE, "ignoredByScheduler": False}],
            "ignorable": False, "httpTimeout": "5s"}]
    return json.dumps(doc)


class Process:
    def __init__(self, argv: List[str], log_name: str, env: Optional[Dict[str, str]] = None) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix=log_name + "-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()

    def tail(self) -> str:
        with open(self.log.name, encoding="utf-8", errors="replace") as fh:
            return fh.read()[-3000:]


class GpuAware(Process):
    """The real agent in cache mode against the local apiserver."""

    def __init__(self, settings: Settings, collections: str = os.path.join(REPO, ".build", "collections"),
                 nice: int = 0) -> None:
        """``collections``: the collection tree to run it from (another checkout's, to compare two versions);
        ``nice``: the agent's nice value (negative: a larger CPU weight than the control plane's processes)."""
        self.port = free_port()
        env = dict(os.environ, PYTHONPATH=collections)
        for key in ("KUBERNETES_SERVICE_HOST", "POD_NAMESPACE"):
            env.pop(key, None)
        # nice(1) execs the agent, so the pid stays the agent's (its /proc schedstat is read per thread).
        prefix = ["nice", "-n", str(nice)] if nice else []
        argv = [sys.executable, "-m", AGENT, "--address", "127.0.0.1", "--port", str(self.port),
                "--kubeconfig", settings.admin_conf, "--namespace", NAMESPACE, "--node-cache", "--log-level", "warning"]
        super().__init__(prefix + argv, "gpu-aware-scale", env)

    def metrics(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def wait_cache(self, nodes: int, timeout: float = 300.0) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("gpu-aware exited: " + self.tail())
            try:
                text = self.metrics()
                cached = metric_value(text, "gpu_aware_node_cache_nodes")
                synced = metric_value(text, "gpu_aware_node_cache_synced")
                if synced == 1 and cached is not None and cached >= nodes:
                    return time.monotonic() - start
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError("gpu-aware's node cache did not reach %d nodes: %s" % (nodes, self.tail()))


def metric_value(text: str, name: str, labels: str = "") -> Optional[float]:
    pattern = re.compile(r"^%s%s\s+(\S+)$" % (re.escape(name), re.escape(labels) if labels else r"(?:\{\})?"),
                         re.M)
    match = pattern.search(text)
    return float(match.group(1)) if match else None


@dataclass(frozen=True)
class Latency:
    count: int
    mean_ms: float
    p50_ms: float
    p99_ms: float
    within_5ms: float      # fraction of calls answered in <= 5 ms (a bucket bound: exact)
    within_1ms: float      # the same for 1 ms (the smallest bucket: p50/p99 below it are interpolations)


def histogram(text: str, name: str, verb: str) -> Latency:
    """p50/p99 interpolated inside the histogram's buckets (as Prometheus' histogram_quantile)."""
    buckets = []
    # labels in either order: prometheus_client (recent versions) writes them sorted, le before verb
    for match in re.finditer(r'^%s_bucket\{(?:verb="%s",le="([^"]+)"|le="([^"]+)",verb="%s")\}\s+(\S+)$'
                             % (re.escape(name), verb, verb), text, re.M):
        le = match.group(1) or match.group(2)
        bound = float("inf") if le == "+Inf" else float(le)
        buckets.append((bound, float(match.group(3))))
    count = metric_value(text, name + "_count", '{verb="%s"}' % verb) or 0.0
    total = metric_value(text, name + "_sum", '{verb="%s"}' % verb) or 0.0
    if not buckets or not count:
        return Latency(0, float("nan"), float("nan"), float("nan"), float("nan"), float("nan"))
    buckets.sort()

    def quantile(q: float) -> float:
        rank = q * count
        lower, seen = 0.0, 0.0
        for bound, cumulative in buckets:
            if cumulative >= rank:
                if bound == float("inf"):
                    return lower * 1000
                share = (rank - seen) / (cumulative - seen) if cumulative > seen else 1.0
                return (lower + (bound - lower) * share) * 1000
            lower, seen = bound, cumulative
        return lower * 1000

    def within(bound: float) -> float:
        return next((c for b, c in buckets if b == bound), 0.0) / count

    return Latency(int(count), total / count * 1000, quantile(0.5), quantile(0.99), within(0.005), within(0.001))


def diff_text(after: str, before: str) -> str:
    """The metrics text with ``before``'s counts subtracted (histogram series only; one run's calls)."""
    old = {}
    for line in before.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            old[key] = float(value)
    out = []
    for line in after.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out.append("%s %s" % (key, float(value) - old.get(key, 0.0)))
    return "\n".join(out)


class Scheduler(Process):
    def __init__(self, settings: Settings, bin_dir: str, extender_port: Optional[int]) -> None:
        self.config = tempfile.NamedTemporaryFile("w", prefix="scale-scheduler-", suffix=".yaml", delete=False)
        self.config.write(scheduler_config(settings.admin_conf, extender_port))
        self.config.close()
        super().__init__([os.path.join(bin_dir, "kube-scheduler"), "--config", self.config.name,
                          "--secure-port", "0", "--v", "1"], "kube-scheduler-scale")

    def stop(self) -> None:
        super().stop()
        os.unlink(self.config.name)


def gpu_pod(index: int, gpus: int) -> Dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gpu-%05d" % index, "namespace": NAMESPACE, "labels": {"app": "scale-bench"}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "tolerations": [dict(fakenodes.TOLERATION)],
            "nodeSelector": {fakenodes.FAKE_LABEL[0]: fakenodes.FAKE_LABEL[1]},
            "containers": [{"name": "train", "image": "registry.invalid/train:1",
                            "resources": {"limits": {fakenodes.RESOURCE: str(gpus)},
                                          "requests": {"cpu": "100m", fakenodes.RESOURCE: str(gpus)}}}],
        },
    }


def ensure_namespace(client: fakenodes.ApiClient) -> None:
    try:
        client.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": NAMESPACE}})
    except fakenodes.ApiError as exc:
        if exc.status != 409:
            raise


def delete_pods(client: fakenodes.ApiClient, timeout: float = 300.0) -> None:
    """Delete the benchmark's pods and wait until they are gone (kwok's pod-delete stage removes them)."""
    fakenodes.delete_collection(client, "/api/v1/namespaces/%s/pods" % NAMESPACE, timeout=timeout)


def delete_namespace(client: fakenodes.ApiClient) -> None:
    try:
        client.request("DELETE", "/api/v1/namespaces/" + NAMESPACE)
    except fakenodes.ApiError as exc:
        if exc.status != 404:
            raise


class Watch:
    """One watch on ``path`` in a thread, resumed from the last resourceVersion; ``seen`` gets each event."""

    def __init__(self, client: fakenodes.ApiClient, path: str, resource_version: str,
                 params: Optional[Dict[str, str]] = None) -> None:
        self.client = client
        self.path = path
        self.params = dict(params or {})
        self._rv = resource_version
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="watch " + path)
        self._thread.start()

    def seen(self, line: bytes, event: Dict[str, Any]) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop:
            conn = http.client.HTTPSConnection(self.client.host, self.client.port, context=self.client.context,
                                               timeout=5)
            try:
                conn.request("GET", "%s?%s" % (self.path, urllib.parse.urlencode(dict(
                    self.params, watch="1", resourceVersion=self._rv, allowWatchBookmarks="true",
                    timeoutSeconds="120"))))
                resp = conn.getresponse()
                while not self._stop:
                    line = resp.readline()
                    if not line:
                        break
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    self._rv = (obj.get("metadata") or {}).get("resourceVersion") or self._rv
                    self.seen(line, event)
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(0.2)
            finally:
                conn.close()

    def stop(self) -> None:
        self._stop = True
        self._thread.join(timeout=10)


class BindWatch(Watch):
    """Records when each benchmark pod gets a node (one pod watch on the namespace)."""

    def __init__(self, client: fakenodes.ApiClient, resource_version: str) -> None:
        self.bound: Dict[str, float] = {}
        self.nodes: Dict[str, str] = {}
        super().__init__(client, "/api/v1/namespaces/%s/pods" % NAMESPACE, resource_version)

    def seen(self, line: bytes, event: Dict[str, Any]) -> None:
        obj = event.get("object") or {}
        node = (obj.get("spec") or {}).get("nodeName")
        name = (obj.get("metadata") or {}).get("name")
        if node and name and name not in self.bound:
            self.bound[name] = time.monotonic()
            self.nodes[name] = node

    def wait(self, count: int, timeout: float, stall: float = 20.0) -> bool:
        """Until ``count`` pods are bound, ``timeout`` passed, or no binding came for ``stall`` seconds."""
        start = last_change = time.monotonic()
        seen = 0
        while len(self.bound) < count and time.monotonic() - start < timeout:
            if len(self.bound) != seen:
                seen, last_change = len(self.bound), time.monotonic()
            elif time.monotonic() - last_change > stall:
                break
            time.sleep(0.1)
        return len(self.bound) >= count


class NodeEvents(Watch):
    """Counts the Node watch events (and their bytes) that an extender's node watch receives meanwhile."""

    def __init__(self, client: fakenodes.ApiClient) -> None:
        self.events: Dict[str, int] = {}
        self.bytes = 0
        rv = client.request("GET", "/api/v1/nodes?limit=1")["metadata"]["resourceVersion"]
        super().__init__(client, "/api/v1/nodes", rv)

    def seen(self, line: bytes, event: Dict[str, Any]) -> None:
        kind = str(event.get("type"))
        self.events[kind] = self.events.get(kind, 0) + 1
        if kind != "BOOKMARK":
            self.bytes += len(line)


@dataclass(frozen=True)
class ThreadTime:
    """One thread's CPU time and its time waiting for a CPU on the run queue (/proc schedstat), in seconds."""

    cpu_s: float
    runqueue_s: float


def thread_times(pid: int) -> Dict[int, ThreadTime]:
    """Per thread id of ``pid``. A thread that waits for the GIL sleeps on a futex: neither CPU nor run queue."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid), encoding="ascii") as fh:
                run_ns, wait_ns = fh.read().split()[:2]
        except OSError:
            continue
        out[int(tid)] = ThreadTime(int(run_ns) / 1e9, int(wait_ns) / 1e9)
    return out


def thread_diff(after: Dict[int, ThreadTime], before: Dict[int, ThreadTime]) -> Dict[int, ThreadTime]:
    zero = ThreadTime(0.0, 0.0)
    return {tid: ThreadTime(t.cpu_s - before.get(tid, zero).cpu_s, t.runqueue_s - before.get(tid, zero).runqueue_s)
            for tid, t in after.items()}


@dataclass(frozen=True)
class Throughput:
    pods: int
    bound: int
    seconds: float          # from the scheduler's first binding to its last
    pods_per_s: float


def schedule_pods(client: fakenodes.ApiClient, settings: Settings, bin_dir: str, pods: int,
                  extender_port: Optional[int], timeout: float = 600.0,
                  when_bound: Optional[Callable[[], None]] = None) -> Throughput:
    """Create ``pods`` GPU pods (Pending: no scheduler has their name yet), start the scheduler, time the bindings.

    ``when_bound`` runs once the pods are bound, before the scheduler stops (and its connections with it)."""
    ensure_namespace(client)
    path = "/api/v1/namespaces/%s/pods" % NAMESPACE
    sizes = (1, 1, 1, 2, 1, 4, 1, 2)   # mostly single-GPU, some 2 and 4
    fakenodes._parallel(lambda i: client.request("POST", path, gpu_pod(i, sizes[i % len(sizes)])),
                        list(range(pods)), 8)
    rv = client.request("GET", path + "?limit=1")["metadata"]["resourceVersion"]
    watch = BindWatch(client, rv)
    scheduler = Scheduler(settings, bin_dir, extender_port)
    try:
        watch.wait(pods, timeout)
        if when_bound is not None:
            when_bound()
        if scheduler.proc.poll() is not None:
            raise RuntimeError("kube-scheduler exited: " + scheduler.tail())
    finally:
        scheduler.stop()
        watch.stop()
    times = sorted(watch.bound.values())
    seconds = (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return Throughput(pods, len(times), seconds, (len(times) - 1) / seconds if seconds and seconds > 0 else 0.0)
