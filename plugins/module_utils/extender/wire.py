# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The extender's wire format (``k8s.io/kube-scheduler/extender/v1``).

Request ``ExtenderArgs``: ``{"Pod": {...}, "Nodes": {"items": [...]}, "NodeNames": null}``
(``nodeCacheCapable: false``) or ``{"Pod": {...}, "Nodes": null, "NodeNames": [...]}``
(``true``). Answers: ``ExtenderFilterResult`` (``Nodes`` or ``NodeNames``,
``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``) and
``HostPriorityList`` (``[{"Host": ..., "Score": 0..10}]``).

With full Node objects the request runs to tens of MB at thousands of nodes,
and kube-scheduler (v1.36 ``HTTPExtender.Filter``) builds the next stage from
the Node objects *returned* in ``Nodes.items``. So the parser walks the
document with the standard library's C scanner one value at a time, keeps
the byte span of every node, hands each node to a callback that extracts what
gpu-aware needs and lets the object go, and the filter answer copies the
passing nodes' original JSON text instead of re-encoding them. Parsing is
still complete and strict: anything that is not one JSON document is refused.
Keys match case-insensitively, as Go's ``encoding/json`` does.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from ..errors import MetaxGpuError
from .demand import json_type
from .nodeinfo import node_problem

T = TypeVar("T")

_DECODER = json.JSONDecoder()
# CPython's scanner internals (stable since 3.x, absent from typeshed): the fast path.
_SCAN = _DECODER.scan_once  # type: ignore[attr-defined]
_SCANSTRING = json.decoder.scanstring  # type: ignore[attr-defined]
_WS = re.compile(r"[ \t\n\r]*")


class BadRequest(MetaxGpuError, ValueError):
    """The body is not acceptable ExtenderArgs; answered with HTTP 400."""


@dataclass
class ParsedArgs:
    """ExtenderArgs with the nodes reduced to what a callback extracted."""

    pod: Dict[str, Any]
    names: List[str]                   # candidate node names, request order
    extracted: List[Any]               # extract(node) per node (Nodes form); empty for NodeNames
    node_names_form: bool              # True: NodeNames (nodeCacheCapable), False: Nodes
    text: str = ""                     # the decoded body (Nodes form: spans index into it)
    spans: List[Tuple[int, int]] = field(default_factory=list)
    plain_names: bool = False          # no name needs escaping in JSON (checked once per request)


def _ws(text: str, index: int) -> int:
    match = _WS.match(text, index)   # matches the empty string, so never None
    return match.end() if match else index


def _expect(text: str, index: int, char: str, what: str) -> int:
    if text.startswith(char, index):
        return index + 1
    got = repr(text[index:index + 20]) if index < len(text) else "end of body"
    raise BadRequest("malformed JSON: expected %r %s at offset %d, got %s" % (char, what, index, got))


def _value(text: str, index: int) -> Tuple[Any, int]:
    try:
        return _SCAN(text, index)
    except StopIteration:
        raise BadRequest("malformed JSON: expected a value at offset %d" % index) from None
    except json.JSONDecodeError as exc:
        raise BadRequest("malformed JSON: %s" % exc) from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply at offset %d" % index) from None


def _key(text: str, index: int) -> Tuple[str, int]:
    index = _expect(text, index, '"', "(an object key)")
    try:
        key, index = _SCANSTRING(text, index, True)
    except json.JSONDecodeError as exc:
        raise BadRequest("malformed JSON: %s" % exc) from None
    index = _ws(text, index)
    index = _expect(text, index, ":", "after an object key")
    return key, _ws(text, index)


def _object(text: str, index: int, on_key: Callable[[str, int], int]) -> int:
    """Walk a JSON object at ``index``; ``on_key(key, value_index)`` returns the index after the value."""
    index = _expect(text, index, "{", "(an object)")
    index = _ws(text, index)
    if text.startswith("}", index):
        return index + 1
    while True:
        key, index = _key(text, index)
        index = _ws(text, on_key(key, index))
        if text.startswith(",", index):
            index = _ws(text, index + 1)
            continue
        return _expect(text, index, "}", "or ',' in an object")


def _wrong_type(text: str, index: int, field: str, expected: str) -> BadRequest:
    """The error for a value at ``index`` that is not what ``field`` holds."""
    value = _value(text, index)[0]
    return BadRequest("%s: expected %s, got %s" % (field, expected, json_type(value)))


def _first_repeat(names: Sequence[str]) -> Optional[Tuple[int, int]]:
    """(first index, repeating index) of the first name that occurs twice, or None."""
    if len(set(names)) == len(names):
        return None
    seen: Dict[str, int] = {}
    for index, name in enumerate(names):
        if name in seen:
            return seen[name], index
        seen[name] = index
    return None  # pragma: no cover - the set said there is a repeat


# kube-scheduler's encoding of the NodeNames form (Go encoding/json: compact, struct field order).
_GO_POD = '{"Pod":'
_GO_NAMES = ',"Nodes":null,"NodeNames":'
_POD_MEMO_SIZE = 4


class _PodMemo:
    """The last few Pods' JSON text -> the decoded Pod, shared read-only by the requests that send it.

    kube-scheduler sends the same Pod, byte for byte, to filter and then to prioritize: the second call
    finds it here instead of decoding it again. Text -> value is a pure function, so nothing goes stale.
    """

    def __init__(self, size: int = _POD_MEMO_SIZE) -> None:
        self.size = size
        self._pods: Dict[str, Dict[str, Any]] = {}
        self._lock = threading.Lock()

    def get(self, text: str) -> Optional[Dict[str, Any]]:
        return self._pods.get(text)

    def put(self, text: str, pod: Dict[str, Any]) -> None:
        with self._lock:
            while len(self._pods) >= self.size:
                del self._pods[next(iter(self._pods))]    # the oldest (dicts keep insertion order)
            self._pods[text] = pod


POD_MEMO = _PodMemo()


def _go_names_form(text: str) -> Optional[Tuple[Any, Any]]:
    """(Pod, NodeNames) when ``text`` is exactly ``{"Pod":<value>,"Nodes":null,"NodeNames":<value>}``, else None.

    That is what kube-scheduler sends with ``nodeCacheCapable: true``; the general walk in parse_args
    would find the same two values, with more Python work per request. Anything else returns None and
    takes the general walk (which also words the errors).
    """
    if not text.startswith(_GO_POD) or not text.endswith("}"):
        return None
    # The last occurrence: a string value cannot hold it (its quotes would be escaped), and a Pod that
    # does hold it as structure makes the Pod end elsewhere, which the check below refuses.
    middle = text.rfind(_GO_NAMES)
    if middle < 0:
        return None
    pod_text = text[len(_GO_POD):middle]
    pod = POD_MEMO.get(pod_text)
    try:
        if pod is None:
            value, end = _SCAN(text, len(_GO_POD))
            if end != middle or not isinstance(value, dict):
                return None
            pod = value
            POD_MEMO.put(pod_text, pod)
        names, end = _SCAN(text, middle + len(_GO_NAMES))
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(text) - 1:
        return None
    return pod, names


def parse_args(body: Union[bytes, bytearray], extract: Callable[[Dict[str, Any]], T]) -> ParsedArgs:
    """Parse ExtenderArgs; ``extract(node)`` is called once per node of the Nodes form.

    Raises :class:`BadRequest` with a message for the ``Error`` field. Every
    message about a well-formed JSON document starts with the field that is
    wrong (``Pod``, ``Nodes.items[3].metadata.name``, ``NodeNames[0]``...).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest("body is not UTF-8: %s" % exc) from None
    found: Dict[str, Any] = {}
    spans: List[Tuple[int, int]] = []
    names: List[str] = []
    extracted: List[Any] = []

    def items(index: int) -> int:
        if text.startswith("null", index):
            return index + 4
        spans.clear()
        names.clear()
        extracted.clear()
        if not text.startswith("[", index):
            raise _wrong_type(text, index, "Nodes.items", "an array or null")
        index = _ws(text, index + 1)
        if text.startswith("]", index):
            return index + 1
        while True:
            node, end = _value(text, index)
            where = "Nodes.items[%d]" % len(spans)
            if not isinstance(node, dict):
                raise BadRequest("%s: expected an object, got %s" % (where, json_type(node)))
            metadata = node.get("metadata")
            if not isinstance(metadata, dict):
                raise BadRequest("%s.metadata: expected an object, got %s" % (where, json_type(metadata)))
            name = metadata.get("name")
            if not isinstance(name, str) or not name:
                raise BadRequest("%s.metadata.name: expected a non-empty string, got %s"
                                 % (where, json_type(name) if name != "" else "an empty string"))
            problem = node_problem(node)
            if problem is not None:
                raise BadRequest("%s.%s" % (where, problem))
            spans.append((index, end))
            names.append(name)
            extracted.append(extract(node))
            index = _ws(text, end)
            if text.startswith(",", index):
                index = _ws(text, index + 1)
                continue
            return _expect(text, index, "]", "or ',' in Nodes.items")

    def nodes_key(key: str, index: int) -> int:
        if key.lower() == "items":
            return items(index)
        return _value(text, index)[1]

    def top_key(key: str, index: int) -> int:
        lowered = key.lower()
        if lowered == "nodes":
            if text.startswith("null", index):
                found["nodes"] = None
                return index + 4
            if not text.startswith("{", index):
                raise _wrong_type(text, index, "Nodes", "an object or null")
            found["nodes"] = True
            return _object(text, index, nodes_key)
        value, end = _value(text, index)
        if lowered in ("pod", "nodenames"):
            found[lowered] = value
        return end

    fast = _go_names_form(text)
    if fast is not None:
        found["pod"], found["nodenames"] = fast
    else:
        _walk(text, top_key)
    if "pod" not in found:
        raise BadRequest("Pod: missing")
    pod = found["pod"]
    if not isinstance(pod, dict):
        raise BadRequest("Pod: expected an object, got %s" % json_type(pod))
    node_names = found.get("nodenames")
    if node_names is not None:
        if not isinstance(node_names, list):
            raise BadRequest("NodeNames: expected an array of strings or null, got %s" % json_type(node_names))
        try:
            # str.join refuses anything but strings: the type check, at C speed, and the text _plain needs.
            joined = "".join(node_names)
        except TypeError:
            bad = next(i for i, name in enumerate(node_names) if not isinstance(name, str))
            raise BadRequest("NodeNames[%d]: expected a string, got %s" % (bad, json_type(node_names[bad]))) from None
        repeat = _first_repeat(node_names)
        if repeat is not None:
            raise BadRequest("NodeNames[%d]: %s repeats NodeNames[%d]"
                             % (repeat[1], json.dumps(node_names[repeat[1]]), repeat[0]))
        if found.get("nodes") and names != node_names:
            # kube-scheduler sends one of the two; a body with both must at least agree with itself.
            _check_same_nodes(node_names, names)
        return ParsedArgs(pod=pod, names=node_names, extracted=[], node_names_form=True,
                          plain_names=_plain_text(joined))
    if not found.get("nodes"):
        raise BadRequest("Nodes and NodeNames: both missing or null (kube-scheduler sends one of them)")
    repeat = _first_repeat(names)
    if repeat is not None:
        raise BadRequest("Nodes.items[%d].metadata.name: %s repeats Nodes.items[%d]"
                         % (repeat[1], json.dumps(names[repeat[1]]), repeat[0]))
    return ParsedArgs(pod=pod, names=list(names), extracted=list(extracted), node_names_form=False,
                      text=text, spans=list(spans), plain_names=_plain(names))


def _walk(text: str, top_key: Callable[[str, int], int]) -> None:
    """Walk the whole body as one JSON object, ``top_key`` taking each top-level value."""
    index = _ws(text, 0)
    if index < len(text) and text[index] != "{":
        try:
            value = _value(text, index)[0]
        except BadRequest:
            pass                      # not JSON at all: _object reports where
        else:
            raise BadRequest("ExtenderArgs: expected '{' (the body is a JSON %s, not an object)" % json_type(value))
    index = _ws(text, _object(text, index, top_key))
    if index != len(text):
        raise BadRequest("malformed JSON: extra data at offset %d" % index)


def _check_same_nodes(node_names: Sequence[str], item_names: Sequence[str]) -> None:
    """Raise unless NodeNames and the names of Nodes.items are the same set."""
    items = set(item_names)
    for index, name in enumerate(node_names):
        if name not in items:
            raise BadRequest("NodeNames[%d]: %s is not among Nodes.items" % (index, json.dumps(name)))
    listed = set(node_names)
    for index, name in enumerate(item_names):
        if name not in listed:
            raise BadRequest("NodeNames: lacks %s, which Nodes.items[%d] names" % (json.dumps(name), index))


# The characters _plain refuses besides non-ASCII: control characters, quote, backslash, DEL.
_NEEDS_ESCAPE = bytes(range(0x20)) + b'"\\\x7f'


def _plain_text(text: str) -> bool:
    """True when ``text`` needs no escaping in JSON (ASCII, no control character, quote or backslash)."""
    if not text.isascii():
        return False
    # bytes.translate deleting the refused bytes is one C pass: about 3x faster than a regex search
    # over the ~10 KB of names of a 700-node request (docs/scale.md).
    raw = text.encode("ascii")
    return len(raw.translate(None, _NEEDS_ESCAPE)) == len(raw)


def _plain(names: Sequence[str]) -> bool:
    """True when no name needs escaping in JSON (ASCII, no control character, quote or backslash)."""
    return _plain_text("".join(names))


def _string_list(names: Sequence[str], plain: bool = False) -> str:
    if not names:
        return "[]"
    if plain or _plain(names):
        return '["' + '","'.join(names) + '"]'
    return json.dumps(list(names))


def _string_map(mapping: Mapping[str, str], plain: bool = False) -> str:
    if not mapping:
        return "{}"
    values = set(mapping.values())
    if len(values) == 1 and _plain(list(values)) and (plain or _plain(list(mapping))):
        separator = '":"%s","' % values.pop()     # one reason for every node: the common case
        return '{"' + separator.join(mapping) + separator[:-2] + "}"
    return json.dumps(mapping, separators=(",", ":"))


def _failed_maps(failed: Mapping[str, str], unresolvable: Mapping[str, str], plain: bool = False) -> str:
    return '"FailedNodes":%s,"FailedAndUnresolvableNodes":%s' % (
        _string_map(failed, plain), _string_map(unresolvable, plain))


def filter_result_names(passed: Sequence[str], failed: Mapping[str, str],
                        unresolvable: Mapping[str, str], plain: bool = False) -> bytes:
    """ExtenderFilterResult for the NodeNames form; ``plain``: the names are known to need no escaping."""
    return ('{"NodeNames":%s,%s,"Error":""}' % (_string_list(passed, plain),
                                                _failed_maps(failed, unresolvable, plain))).encode("utf-8")


def filter_result_nodes(args: ParsedArgs, passed: Sequence[int], failed: Mapping[str, str],
                        unresolvable: Mapping[str, str]) -> List[bytes]:
    """ExtenderFilterResult for the Nodes form, as chunks to send in order.

    The passing nodes are their original JSON text from the request.
    """
    text = args.text
    spans = args.spans
    head = '{"Nodes":{"metadata":{},"items":['
    tail = ']},%s,"Error":""}' % _failed_maps(failed, unresolvable, args.plain_names)
    body = ",".join([text[spans[i][0]:spans[i][1]] for i in passed])
    return [head.encode("utf-8"), body.encode("utf-8"), tail.encode("utf-8")]


def error_result(message: str) -> bytes:
    """A body with ``Error`` set (ExtenderFilterResult shape) for failed requests."""
    return json.dumps({"Error": message}).encode("utf-8")


_SCORE_SUFFIX = ['","Score":%d}' % score for score in range(11)]


def priority_list(names: Sequence[str], scores: Sequence[int], plain: bool = False) -> bytes:
    """HostPriorityList (``[{"Host": name, "Score": 0..10}, ...]``); ``plain`` as for filter_result_names."""
    if not names:
        return b"[]"
    if (plain or _plain(names)) and min(scores) >= 0 and max(scores) <= 10:
        suffix = _SCORE_SUFFIX
        return ('[{"Host":"' + ',{"Host":"'.join([name + suffix[score] for name, score in zip(names, scores)])
                + "]").encode("ascii")
    return json.dumps([{"Host": name, "Score": score} for name, score in zip(names, scores)],
                      separators=(",", ":")).encode("utf-8")
