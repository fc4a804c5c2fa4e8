# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Our keys on Nodes: the one path by which the collection reads and writes node metadata.

* :class:`OwnNode`: an agent's own node (gpu-label, gpu-device, driver-manager):
  its labels and annotations read as raw JSON (:func:`.pages.raw_get`: no model
  built for a whole Node in every round), and a JSON merge patch of only the
  keys given (``None`` deletes one; nothing given, nothing sent). A refusal
  comes back as one :class:`NodeUnavailable` line with the hint an operator
  needs (403: the RBAC rule; 404: the node name).
* :func:`strip_changes` / :func:`strip`: the one routine that removes our keys
  from nodes (the operator's cleanup of a component, its uninstall, the
  ``node_metadata`` module), by patterns: a key equal to a pattern, or under a
  pattern that ends in ``/`` or ``.`` (a prefix). One merge patch per node
  that carries such keys, nodes without any left alone.

Which keys are ours is names.py's; this module only moves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from ..errors import MetaxGpuError
from .client import ApiException
from .pages import raw_get

__all__ = ["MERGE_PATCH", "NodeChange", "NodeUnavailable", "OwnNode", "matches", "merge_patch", "patch_metadata",
           "strip", "strip_change", "strip_changes"]

MERGE_PATCH = "application/merge-patch+json"
# The reads and patches of an agent's own node: a server that stops answering is a failure retried
# with backoff, not a round blocked for good.
DEFAULT_TIMEOUT = 10.0
HINTS = {
    403: " (RBAC: the service account needs get and patch on nodes)",
    404: " (is --node-name right?)",
}


class NodeUnavailable(MetaxGpuError):
    """The API server could not be reached or refused the read or patch of a node (the agents retry with backoff)."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status


def merge_patch(labels: Optional[Mapping[str, Optional[str]]] = None,
                annotations: Optional[Mapping[str, Optional[str]]] = None) -> Dict[str, Any]:
    """The JSON merge patch (RFC 7386) setting these labels and annotations (``None`` deletes a key);
    {} when there is nothing to write."""
    meta: Dict[str, Any] = {}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"metadata": meta} if meta else {}


def _discard(resp: Any) -> None:
    """A raw answer read to its end and its connection given back, not decoded (a patch answers with
    the whole Node, which nobody here reads)."""
    try:
        getattr(resp, "data", None)
    finally:
        release = getattr(resp, "release_conn", None)
        if callable(release):
            release()


def patch_metadata(core: Any, name: str, labels: Optional[Mapping[str, Optional[str]]] = None,
                   annotations: Optional[Mapping[str, Optional[str]]] = None, **request: Any) -> bool:
    """Merge-patch node ``name``'s labels and annotations through ``core`` (kube/client.core_v1); False, and no
    request, when there is nothing to write. ``request``: the client's own options (``_request_timeout``)."""
    body = merge_patch(labels, annotations)
    if not body:
        return False
    core.patch_node(name, body, _content_type=MERGE_PATCH, **request)
    return True


def read_node(core: Any, name: str, timeout: Any = None) -> Dict[str, Any]:
    """Node ``name`` as the API server's JSON (its resourceVersion included, for a patch that must not race)."""
    return raw_get(core.read_node, name, **({"timeout": timeout} if timeout is not None else {}))


def json_patch_node(core: Any, name: str, ops: Sequence[Mapping[str, Any]], timeout: Any = None) -> None:
    """A JSON patch of node ``name`` (a ``test`` op of the resourceVersion first makes it fail on a race)."""
    _discard(core.patch_node(name, list(ops), _content_type="application/json-patch+json",
                             _preload_content=False, _request_timeout=timeout))


def patch_node_status(core: Any, name: str, body: Mapping[str, Any], timeout: Any = None) -> None:
    """A strategic merge patch of node ``name``'s status: conditions merge by type, others' stay."""
    _discard(core.patch_node_status(name, dict(body), _content_type="application/strategic-merge-patch+json",
                                    _preload_content=False, _request_timeout=timeout))


def merge_patch_node(core: Any, name: str, body: Mapping[str, Any]) -> None:
    """Merge-patch node ``name`` with ``body`` as given (metadata, a resourceVersion precondition, ``spec``);
    the answer is read to its end, not decoded."""
    _discard(core.patch_node(name, dict(body), _content_type=MERGE_PATCH, _preload_content=False))


class OwnNode:
    """Our keys on the node this agent runs on, through ``core`` (kube/client.core_v1; RBAC: get and patch on nodes)."""

    def __init__(self, core: Any, name: str, timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        self.core = core
        self.name = name
        self.timeout = timeout

    def _call(self, what: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ApiException as exc:
            status = getattr(exc, "status", None)
            raise NodeUnavailable("%s node %s: HTTP %s %s%s" % (what, self.name, status, getattr(exc, "reason", ""),
                                                                HINTS.get(status or 0, "")), status) from exc
        except MetaxGpuError:
            raise
        except Exception as exc:  # pylint: disable=broad-except  # urllib3/socket errors of many kinds
            raise NodeUnavailable("%s node %s: %s" % (what, self.name, exc)) from exc

    def read(self) -> Dict[str, Any]:
        """The whole Node as JSON; {} for an answer that is not JSON (a proxy's error page: the caller
        goes on with what it has, as the client would)."""
        return self._call("get", raw_get, self.core.read_node, self.name, lenient=True, timeout=self.timeout)

    def metadata(self) -> Dict[str, Any]:
        """The node's ``metadata`` (labels, annotations...) from its raw JSON ({} when there is none)."""
        meta = self.read().get("metadata")
        return meta if isinstance(meta, dict) else {}

    def labels(self) -> Dict[str, str]:
        return dict(self.metadata().get("labels") or {})

    def annotations(self) -> Dict[str, str]:
        return dict(self.metadata().get("annotations") or {})

    def patch(self, labels: Optional[Mapping[str, Optional[str]]] = None,
              annotations: Optional[Mapping[str, Optional[str]]] = None) -> bool:
        """Write these keys (``None`` deletes one) and no other; False, and no request, when none is given."""
        body = merge_patch(labels, annotations)
        if not body:
            return False
        self._call("patch", lambda: _discard(self.core.patch_node(
            self.name, body, _content_type=MERGE_PATCH, _preload_content=False, _request_timeout=self.timeout)))
        return True


# -- stripping our keys --------------------------------------------------------------------------

def matches(key: str, patterns: Iterable[str]) -> bool:
    """``key`` equals a pattern, or starts with one ending in ``/`` or ``.`` (a prefix)."""
    for pattern in patterns:
        if key == pattern or (pattern.endswith(("/", ".")) and key.startswith(pattern)):
            return True
    return False


@dataclass(frozen=True)
class NodeChange:
    """The keys to remove from one node, each with its value before removal."""

    name: str
    labels: Dict[str, str] = field(default_factory=dict)
    annotations: Dict[str, str] = field(default_factory=dict)

    def metadata_patch(self) -> Dict[str, Dict[str, None]]:
        """The merge patch's ``metadata``: every key of the change to ``None``."""
        return merge_patch(dict.fromkeys(self.labels), dict.fromkeys(self.annotations)).get("metadata", {})


def _matching(values: Optional[Mapping[str, str]], patterns: Sequence[str]) -> Dict[str, str]:
    return {k: v for k, v in sorted((values or {}).items()) if matches(k, patterns)}


def strip_change(node: Mapping[str, Any], label_patterns: Sequence[str],
                 annotation_patterns: Sequence[str]) -> Optional[NodeChange]:
    """What goes from one node (a Node as JSON), None when it carries none of the keys."""
    meta = node.get("metadata") or {}
    labels = _matching(meta.get("labels"), label_patterns)
    annotations = _matching(meta.get("annotations"), annotation_patterns)
    if not labels and not annotations:
        return None
    return NodeChange(str(meta.get("name") or ""), labels, annotations)


def strip_changes(nodes: Iterable[Mapping[str, Any]], label_patterns: Sequence[str],
                  annotation_patterns: Sequence[str], skip: Iterable[str] = ()) -> List[NodeChange]:
    """For each node (but ``skip``) carrying a matching label or annotation, what goes."""
    skipped = set(skip)
    out = []
    for node in nodes:
        change = strip_change(node, label_patterns, annotation_patterns)
        if change is not None and change.name not in skipped:
            out.append(change)
    return out


def strip(core: Any, nodes: Iterable[Mapping[str, Any]], label_patterns: Sequence[str],
          annotation_patterns: Sequence[str], skip: Iterable[str] = (), check_mode: bool = False,
          done: Optional[List[NodeChange]] = None) -> List[NodeChange]:
    """Remove the matching keys from ``nodes`` (as just read), one merge patch per node that has any;
    the changes made (``check_mode``: the changes that would be). ``done``, when given, is filled as
    the patches go, so a caller that fails half-way can say which nodes were changed."""
    made = done if done is not None else []
    for change in strip_changes(nodes, label_patterns, annotation_patterns, skip):
        if not check_mode:
            patch_metadata(core, change.name, dict.fromkeys(change.labels), dict.fromkeys(change.annotations))
        made.append(change)
    return made
