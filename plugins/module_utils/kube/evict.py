# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Evict the pods of one node that use MetaX GPUs, through the eviction API.

Step 3 of the manual's node maintenance (stop the user pods that use MetaX
GPUs). The eviction API, not DELETE, so PodDisruptionBudgets hold: a refused
eviction (429) is retried until ``timeout``; then ``force`` deletes the pod,
otherwise the call fails and names the pods still there. ``drain`` widens the
set to every pod that is not a DaemonSet's or a static (mirror) pod.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..errors import MetaxGpuError
from .client import ApiException
from .pages import raw_list
from .pods import TERMINAL_PHASES, gpu_pods

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# a Node's name is a DNS subdomain (apimachinery IsDNS1123Subdomain)
_NODE_NAME = re.compile(r"\A[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


class NodeNameError(MetaxGpuError, ValueError):
    """A node name that would select other pods than one node's."""


def check_node_name(node: Any) -> str:
    """``node`` if it can name a Node. ``spec.nodeName=`` with an empty name selects the unscheduled pods
    of the whole cluster, and a comma would add terms to the field selector: both refused."""
    if not isinstance(node, str) or len(node) > 253 or not _NODE_NAME.match(node):
        raise NodeNameError("node_name %r is not a node name (a DNS subdomain: lowercase letters, digits, '-' "
                            "and '.', at most 253 characters)" % (node,))
    return node


class EvictionError(MetaxGpuError):
    """Pods still on the node after the timeout (and force is off).

    ``remaining`` names them; ``refused`` maps those whose last eviction the API
    refused with 429 to the API's reason (which names the PodDisruptionBudget).
    ``failed``: an eviction the API answered with another error (an admission
    webhook's denial, say): the message is the API's, nothing was waited for.
    """

    def __init__(self, message: str, remaining: Sequence[str] = (),
                 refused: Optional[Mapping[str, str]] = None, failed: bool = False) -> None:
        super().__init__(message)
        self.remaining = list(remaining)
        self.refused = dict(refused or {})
        self.failed = failed


def refusal(exc: Any) -> str:
    """Why the API refused an eviction: the disruption budget's own words when the body has them."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    causes = [c.get("message") for c in (body.get("details") or {}).get("causes") or [] if c.get("message")]
    return "; ".join(causes) or body.get("message") or "%s %s" % (exc.status, exc.reason)


def _key(pod: Mapping) -> str:
    meta = pod.get("metadata") or {}
    return "%s/%s" % (meta.get("namespace", "default"), meta.get("name", "?"))


def _drainable(pod: Mapping) -> bool:
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return False
    if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return False
    return not any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or [])


def select(pods: List[Mapping], drain: bool) -> List[str]:
    """The pods to evict: GPU pods, or with ``drain`` every drainable pod."""
    if drain:
        return sorted(_key(p) for p in pods if _drainable(p))
    return gpu_pods(pods)


def evict(core: Any, node: str, drain: bool = False, timeout: float = 300.0, force: bool = False,
          check_mode: bool = False, sleep: Callable[[float], None] = time.sleep,
          grace_period: Optional[int] = None, retry_refused: bool = True,
          holders: Optional[Callable[[], List[str]]] = None) -> Dict[str, List[str]]:
    """Evict and wait; returns ``{"evicted": [...], "deleted": [...], "selected": [...]}``.

    ``holders``: the node's GPU pods (``namespace/name``) from elsewhere than a pod list, asked again
    while waiting: driver-manager's from the kubelet's pod-resources API, as it may not list pods
    (docs/security.md). Not with ``drain``.

    Without ``retry_refused`` a budget's refusal ends the call at once (EvictionError naming the
    refused pods, the other pods evicted): for a caller with its own retry, such as an agent's
    round with backoff; ``timeout`` then bounds only the wait for evicted pods to leave.
    """
    check_node_name(node)
    if timeout < 0 or (grace_period is not None and grace_period < 0):
        raise EvictionError("timeout and grace_period must not be negative (got %s, %s)" % (timeout, grace_period))

    def listing() -> List[Mapping]:
        # the pods as JSON (pages.raw_list), not models built and sanitized back to dicts
        return list(raw_list(core.list_pod_for_all_namespaces, field_selector="spec.nodeName=%s" % node).items)

    def selection() -> List[str]:
        return sorted(holders()) if holders is not None and not drain else select(listing(), drain)

    selected = selection()
    result: Dict[str, List[str]] = {"selected": selected, "evicted": [], "deleted": []}
    if check_mode or not selected:
        return result
    body_opts = {"gracePeriodSeconds": grace_period} if grace_period is not None else None
    deadline = time.monotonic() + timeout
    pending = list(selected)
    refused: Dict[str, str] = {}
    while True:
        for key in list(pending):
            namespace, name = key.split("/", 1)
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": name, "namespace": namespace}}
            if body_opts:
                body["deleteOptions"] = body_opts
            try:
                core.create_namespaced_pod_eviction(name, namespace, body)
                result["evicted"].append(key)
                pending.remove(key)
                refused.pop(key, None)
            except ApiException as exc:
                if exc.status == 404:
                    pending.remove(key)
                elif exc.status == 429:      # a PodDisruptionBudget says not now
                    refused[key] = refusal(exc)
                else:     # a webhook's denial or failure, an API error: said as the API said it
                    raise EvictionError("evicting %s: %s %s: %s" % (key, exc.status, exc.reason, refusal(exc)),
                                        [key], failed=True)
        if refused and not retry_refused:
            raise EvictionError("eviction refused on node %s: %s" % (
                node, "; ".join("%s (%s)" % item for item in sorted(refused.items()))), sorted(refused), refused)
        remaining = [k for k in selection() if k in selected]
        if not remaining:
            return result
        if time.monotonic() >= deadline:
            if not force:
                raise EvictionError("pods still on node %s after %ss: %s (set force to delete them)"
                                    % (node, timeout, ", ".join(remaining)), remaining,
                                    {k: v for k, v in refused.items() if k in remaining})
            for key in remaining:
                namespace, name = key.split("/", 1)
                try:
                    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
                    result["deleted"].append(key)
                except ApiException as exc:
                    if exc.status != 404:
                        raise EvictionError("deleting %s: %s %s" % (key, exc.status, exc.reason), [key])
            deadline = time.monotonic() + 60
            force = False
        sleep(1.0)
