# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The eviction guard: a validating admission webhook that confines driver-manager's evictions to its node.

RBAC grants ``pods/eviction create`` cluster-wide or not at all, and a
ValidatingAdmissionPolicy on ``pods/eviction`` sees only the Eviction (the
pod's name and namespace, deleteOptions), never the pod, so CEL cannot compare
the pod's node with the requester's. This webhook can: for a guarded service
account (driver-manager) it reads the pod named by the request and allows the
eviction only when ``pod.spec.nodeName`` is the node named by the requester's
bound service-account token (``userInfo.extra["authentication.kubernetes.io/node-name"]``,
the same claim the node-agent admission policy uses). Everyone else is allowed
(the ValidatingWebhookConfiguration's matchConditions send only the guarded
accounts here; the check of the username is the second line).

It never runs in driver-manager's own pod: a node that is compromised must not
approve its own request. The operator-controller serves it in the GPU Operator
scheme (``--eviction-webhook-port``), a Deployment of the Extensions chart
otherwise (``agents/eviction_webhook.py``); docs/security.md.

:func:`decide` is pure; :class:`EvictionWebhook` turns an AdmissionReview into
its answer with the pod lookup given; :class:`WebhookServer` serves it over
HTTPS with the bounds of the agents' ``/metrics`` servers (``kubelet/httpserve.py``:
a connection cap, a request deadline) and a body limit. Standard library only.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, Optional, Tuple

from .errors import MetaxGpuError
from .kube.pages import raw_get
from .kubelet.httpserve import BoundedHandler, BoundedHTTPServer

LOG = logging.getLogger("eviction-webhook")

# The claim of a service-account token bound to a pod (Kubernetes >= 1.30 by default)
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
PATH = "/validate-eviction"
# An AdmissionReview of an Eviction is 1-3 KiB (the userInfo's groups and extra included); 64 KiB
# leaves room for long group lists and refuses anything that is not a review.
MAX_BODY_BYTES = 64 * 1024
# The API server calls with its own timeout (the configuration's timeoutSeconds, 10 s at most here) and
# reuses few connections; more than this at once is not the API server.
MAX_CONNECTIONS = 32
REQUEST_TIMEOUT = 10.0

# metav1.Status reasons of the denials' codes
REASONS = {404: "NotFound", 503: "ServiceUnavailable"}
# The pod's node by (namespace, name): None when the pod does not exist; raises when it cannot be read.
PodNode = Callable[[str, str], Optional[str]]


@dataclass(frozen=True)
class Decision:
    """An AdmissionResponse's verdict: ``code`` is the HTTP status the API server answers a denial with."""

    allowed: bool
    message: str = ""
    code: int = 200


def requester_node(request: Mapping[str, Any]) -> Optional[str]:
    """The node named by the requester's bound token (exactly one value), or None."""
    extra = (request.get("userInfo") or {}).get("extra") or {}
    values = extra.get(NODE_NAME_EXTRA) if isinstance(extra, Mapping) else None
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str) and values[0]:
        return values[0]
    return None


def eviction_target(request: Mapping[str, Any]) -> Optional[Tuple[str, str]]:
    """(namespace, pod) a ``pods/eviction`` CREATE names, or None when the request is anything else."""
    resource = request.get("resource") or {}
    if (resource.get("group") or "") != "" or resource.get("resource") != "pods" \
            or request.get("subResource") != "eviction" or request.get("operation") != "CREATE":
        return None
    namespace, name = request.get("namespace"), request.get("name")
    if not isinstance(namespace, str) or not namespace or not isinstance(name, str) or not name:
        return None
    return namespace, name


def guarded(request: Mapping[str, Any], users: Collection[str]) -> bool:
    """Whether the requester is one of the guarded service accounts' usernames."""
    return (request.get("userInfo") or {}).get("username") in users


def decide(request: Mapping[str, Any], users: Collection[str], pod_found: bool,
           pod_node: Optional[str]) -> Decision:
    """The verdict on an AdmissionRequest, the pod it names having been read (pure).

    ``pod_found``/``pod_node``: whether the pod exists and its ``spec.nodeName`` ("" or None:
    not scheduled). A guarded requester may evict a pod of its own node only; a pod that does
    not exist is denied with 404, which the eviction code reads as "already gone"."""
    if not guarded(request, users):
        return Decision(True)
    who = (request.get("userInfo") or {}).get("username")
    target = eviction_target(request)
    if target is None:
        return Decision(False, "%s: the eviction guard admits only the eviction of a pod (pods/eviction CREATE)"
                        % who, 403)
    node = requester_node(request)
    if node is None:
        return Decision(False, "%s may evict only the pods of the node its pod runs on, and this token names no "
                        "node (no %s: use the pod's own service-account token)" % (who, NODE_NAME_EXTRA), 403)
    key = "%s/%s" % target
    if not pod_found:
        return Decision(False, "pod %s not found" % key, 404)
    if pod_node != node:
        return Decision(False, "%s may evict only the pods of its own node %s, not pod %s on %s"
                        % (who, node, key, "node " + pod_node if pod_node else "no node (unscheduled)"), 403)
    return Decision(True)


def response(uid: Any, decision: Decision, api_version: str = "admission.k8s.io/v1") -> dict:
    """The AdmissionReview that answers request ``uid``."""
    answer: dict = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        answer["status"] = {"code": decision.code, "message": decision.message,
                            "reason": REASONS.get(decision.code, "Forbidden")}
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": answer}


class ReviewError(MetaxGpuError, ValueError):
    """A body that is not an AdmissionReview with a request."""


class EvictionWebhook:
    """AdmissionReview in, AdmissionReview out, the pod read through ``pod_node``.

    A pod that cannot be read (the API server unreachable, the guard without the right) is
    denied with 503: the eviction fails and driver-manager's round retries it with backoff,
    rather than an eviction let through unchecked."""

    def __init__(self, pod_node: PodNode, users: Collection[str]) -> None:
        self.pod_node = pod_node
        self.users = frozenset(users)

    def review(self, body: bytes) -> dict:
        try:
            review = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ReviewError("not JSON: %s" % exc)
        request = review.get("request") if isinstance(review, dict) else None
        if not isinstance(request, dict) or not request.get("uid"):
            raise ReviewError("not an AdmissionReview with a request")
        api_version = review.get("apiVersion") if review.get("apiVersion") in (
            "admission.k8s.io/v1", "admission.k8s.io/v1beta1") else "admission.k8s.io/v1"
        decision = self.decide(request)
        if not decision.allowed:
            LOG.warning("denied: %s", decision.message)
        return response(request["uid"], decision, api_version)

    def decide(self, request: Mapping[str, Any]) -> Decision:
        target = eviction_target(request)
        if not guarded(request, self.users) or target is None or requester_node(request) is None:
            return decide(request, self.users, False, None)     # decided without the pod
        try:
            node = self.pod_node(*target)
        except Exception as exc:  # pylint: disable=broad-except  # the client raises many kinds: fail closed
            LOG.warning("cannot read pod %s/%s: %s", target[0], target[1], exc)
            return Decision(False, "the eviction guard cannot read pod %s/%s: %s"
                            % (target[0], target[1], str(exc)[:300]), 503)
        return decide(request, self.users, node is not None, node or None)


def service_account_users(namespace: str, accounts: Collection[str]) -> Tuple[str, ...]:
    """The usernames of service accounts ``accounts`` of ``namespace``."""
    return tuple(sorted("system:serviceaccount:%s:%s" % (namespace, name) for name in accounts))


def kube_pod_node(core: Any, timeout: float = 5.0) -> PodNode:
    """A :data:`PodNode` over kube/client.core_v1 (GET of the pod by name; 404 -> None)."""

    def pod_node(namespace: str, name: str) -> Optional[str]:
        try:
            pod = raw_get(core.read_namespaced_pod, name, namespace, timeout=timeout)
        except Exception as exc:  # pylint: disable=broad-except  # ApiException, without importing the client
            if getattr(exc, "status", None) == 404:
                return None
            raise
        return str((pod.get("spec") or {}).get("nodeName") or "")

    return pod_node


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class _Handler(BoundedHandler):
    server: "WebhookServer"

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):    # the handshake in this thread, within the deadline
            self.request.settimeout(self.server.request_timeout)
            self.request.do_handshake()
        super().setup()

    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        if self.path.split("?", 1)[0] != PATH:
            self._send(404, {"error": "not found: POST %s" % PATH})
            return
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self._send(411, {"error": "Content-Length required"})
            return
        if length < 0 or length > self.server.max_body_bytes:
            self._send(413, {"error": "body over %d bytes" % self.server.max_body_bytes})
            return
        body = self.rfile.read(length)
        if len(body) != length:
            return          # the client went away
        try:
            self._send(200, self.server.webhook.review(body))
        except ReviewError as exc:
            self._send(400, {"error": str(exc)})

    def do_GET(self) -> None:  # noqa: N802
        if self.path.split("?", 1)[0] in ("/healthz", "/readyz"):
            self._send(200, {"ok": True})
        else:
            self._send(404, {"error": "not found"})

    def _send(self, code: int, doc: Mapping[str, Any]) -> None:
        self.send_body(code, json.dumps(doc).encode(), "application/json")


class WebhookServer(BoundedHTTPServer):
    """HTTPS on ``address``: POST :data:`PATH` (AdmissionReview), GET /healthz."""

    def __init__(self, address: Tuple[str, int], webhook: EvictionWebhook, ssl_context: Optional[ssl.SSLContext],
                 max_connections: int = MAX_CONNECTIONS, request_timeout: float = REQUEST_TIMEOUT,
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__(address, _Handler, max_connections, request_timeout)
        if ssl_context is not None:
            self.socket = ssl_context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.webhook = webhook
        self.max_body_bytes = max_body_bytes

    def start(self) -> threading.Thread:
        return self.serve_in_thread("eviction-webhook")


# -- flags, shared by the guard's own agent and the operator-controller ------------------------
def add_flags(parser: Any, default_port: int = 0) -> None:
    """The guard's flags on an argparse parser (``--eviction-webhook-port 0``: not served)."""
    parser.add_argument("--eviction-webhook-port", type=int, default=default_port,
                        help="HTTPS port of the eviction guard (admission webhook; 0 = off)")
    parser.add_argument("--eviction-webhook-address", default="",
                        help="address it listens on ('' = all of the pod's addresses: the API server calls the pod IP)")
    parser.add_argument("--eviction-webhook-tls-dir", default="/etc/metax/eviction-webhook",
                        help="directory of its certificate and key (tls.crt, tls.key: a kubernetes.io/tls Secret)")
    parser.add_argument("--eviction-webhook-guard", action="append", default=None, metavar="SERVICE_ACCOUNT",
                        help="service account (of --namespace) whose evictions are confined to its node "
                             "(repeatable; default driver-manager)")


def serve_from_flags(core: Any, args: Any) -> WebhookServer:
    """Start the guard from :func:`add_flags`' flags, the pods read through ``core``; returns it serving."""
    import os
    from . import names
    tls = tls_context(os.path.join(args.eviction_webhook_tls_dir, "tls.crt"),
                      os.path.join(args.eviction_webhook_tls_dir, "tls.key"))
    users = service_account_users(args.namespace, args.eviction_webhook_guard or [names.SERVICE_ACCOUNT_DRIVER_MANAGER])
    server = WebhookServer((args.eviction_webhook_address, args.eviction_webhook_port),
                           EvictionWebhook(kube_pod_node(core), users), tls)
    server.start()
    LOG.info("eviction guard on :%d%s for %s", server.port, PATH, ", ".join(users))
    return server
