# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Text-preserving edits of the kube-scheduler static pod manifest.

The manifest is parsed only to locate nodes (PyYAML's composer gives each
node's line and column); the change itself is a splice of whole lines into the
original text. Comments, key order, quoting and blank lines stay as they were,
and removing the lines we added gives back the original bytes.

Added: ``--config=<config_path>`` in the container's command (or replacing an
existing ``--config``, whose source text the caller keeps to put back), a
read-only mount of ``config_path`` and a ``File`` hostPath volume (the
manual's ``extenderconfig``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import yamlsupport

CONFIG_FLAG = "--config="
VOLUME_NAME = "extenderconfig"     # the manual's name (section 2.1.5 step 3)
CONTAINER_NAME = "kube-scheduler"
_DASH_PREFIX = re.compile(r"^\s*-\s+$")
_PLAIN_SAFE = re.compile(r"^[A-Za-z0-9_./=+@-][A-Za-z0-9_./=+@:-]*$")


class ManifestError(MetaxGpuError, ValueError):
    """A manifest this module cannot read or edit safely; nothing is written."""


@dataclass(frozen=True)
class Probe:
    """Where the kubelet checks the scheduler (kubeadm: HTTPS 127.0.0.1:10259)."""

    scheme: str
    host: str
    port: int
    path: str


@dataclass(frozen=True)
class ManifestInfo:
    image: str
    config_arg: Optional[str]       # source text of the --config item, as written
    config_path: Optional[str]      # the path it names
    kubeconfig: Optional[str]       # --kubeconfig (ignored by the scheduler once --config is given)
    mount_paths: Tuple[str, ...]
    volume_paths: Tuple[str, ...]
    probe: Optional[Probe]
    command: Tuple[str, ...] = ()   # command + args: the argv the container runtime gives the process

    def patched(self, config_path: str) -> bool:
        return (self.config_path == config_path and config_path in self.mount_paths
                and config_path in self.volume_paths)


@dataclass(frozen=True)
class _Pod:
    lines: List[str]
    newline: str
    container: Any
    flags: Any            # SequenceNode holding the flags (command, or args when it has them)
    mounts: Any
    volumes: Any


# ---------------------------------------------------------------- parsing

def _compose(text: str) -> Any:
    try:
        docs = [doc for doc in yamlsupport.yaml.compose_all(text, Loader=yamlsupport.yaml.SafeLoader)
                if doc is not None]
    except yamlsupport.yaml.YAMLError as exc:
        raise ManifestError("the kube-scheduler manifest is not valid YAML: %s" % exc)
    if len(docs) != 1:
        raise ManifestError("the kube-scheduler manifest holds %d YAML documents, expected one Pod" % len(docs))
    return docs[0]


def _get(node: Any, key: str) -> Any:
    if not isinstance(node, yamlsupport.yaml.MappingNode):
        return None
    for knode, vnode in node.value:
        if isinstance(knode, yamlsupport.yaml.ScalarNode) and knode.value == key:
            return vnode
    return None


def _scalar(node: Any) -> Optional[str]:
    return node.value if isinstance(node, yamlsupport.yaml.ScalarNode) else None


def _block_seq(node: Any, what: str) -> Any:
    if node is None:
        return None
    if not isinstance(node, yamlsupport.yaml.SequenceNode):
        raise ManifestError("%s in the kube-scheduler manifest is not a list" % what)
    if node.flow_style and node.value:
        raise ManifestError("%s in the kube-scheduler manifest is a flow-style list ([...]); "
                            "write it as a block list to let the module edit it" % what)
    return node


def _parse(text: str) -> _Pod:
    root = _compose(text)
    if _scalar(_get(root, "kind")) != "Pod":
        raise ManifestError("the kube-scheduler manifest is not a Pod (kind %r)" % _scalar(_get(root, "kind")))
    spec = _get(root, "spec")
    containers = _block_seq(_get(spec, "containers"), "spec.containers")
    if not containers or not containers.value:
        raise ManifestError("the kube-scheduler manifest has no containers")
    named = [c for c in containers.value if _scalar(_get(c, "name")) == CONTAINER_NAME]
    if len(named) != 1 and len(containers.value) != 1:
        raise ManifestError("the kube-scheduler manifest has no single container named %s" % CONTAINER_NAME)
    container = named[0] if named else containers.value[0]
    command = _block_seq(_get(container, "command"), "command")
    args = _block_seq(_get(container, "args"), "args")
    flags = args if args is not None and args.value else command
    if flags is None or not flags.value:
        raise ManifestError("the kube-scheduler container has neither command nor args to add --config to")
    mounts = _block_seq(_get(container, "volumeMounts"), "volumeMounts")
    volumes = _block_seq(_get(spec, "volumes"), "spec.volumes")
    if mounts is None or not mounts.value or volumes is None or not volumes.value:
        raise ManifestError("the kube-scheduler manifest has no volumeMounts/volumes lists "
                            "(kubeadm always writes the kubeconfig mount); refusing to guess the layout")
    newline = "\r\n" if "\r\n" in text else "\n"
    return _Pod(text.splitlines(True), newline, container, flags, mounts, volumes)


def _all_flags(pod: _Pod) -> List[Any]:
    items = []
    for key in ("command", "args"):
        node = _get(pod.container, key)
        if isinstance(node, yamlsupport.yaml.SequenceNode):
            items.extend(node.value)
    return items


def _config_items(pod: _Pod) -> List[Any]:
    found = []
    items = _all_flags(pod)
    for index, item in enumerate(items):
        value = _scalar(item) or ""
        if value == "--config" and index + 1 < len(items):
            raise ManifestError("the scheduler's --config is given as two list items; "
                                "write it as --config=PATH to let the module manage it")
        if value.startswith(CONFIG_FLAG):
            found.append(item)
    if len(found) > 1:
        raise ManifestError("the kube-scheduler command has %d --config flags" % len(found))
    return found


def _flag_value(pod: _Pod, flag: str) -> Optional[str]:
    for item in _all_flags(pod):
        value = _scalar(item) or ""
        if value.startswith(flag + "="):
            return value[len(flag) + 1:]
    return None


def _source(pod: _Pod, node: Any) -> str:
    start, end = node.start_mark, node.end_mark
    if start.line != end.line:
        raise ManifestError("a --config value spanning several lines cannot be edited safely")
    return pod.lines[start.line][start.column:end.column]


def _mount_items(pod: _Pod, path: str) -> List[Any]:
    return [m for m in pod.mounts.value if _scalar(_get(m, "mountPath")) == path]


def _volume_items(pod: _Pod, path: str) -> List[Any]:
    return [v for v in pod.volumes.value if _scalar(_get(_get(v, "hostPath"), "path")) == path]


def _probe(container: Any) -> Optional[Probe]:
    for key in ("readinessProbe", "startupProbe", "livenessProbe"):
        get = _get(_get(container, key), "httpGet")
        if get is None:
            continue
        port = _scalar(_get(get, "port")) or "10259"
        try:
            port_number = int(port)
        except ValueError:
            port_number = 10259
        return Probe(scheme=(_scalar(_get(get, "scheme")) or "HTTP").lower(),
                     host=_scalar(_get(get, "host")) or "127.0.0.1",
                     port=port_number, path=_scalar(_get(get, "path")) or "/healthz")
    return None


def inspect(text: str) -> ManifestInfo:
    """What the manifest runs: image, --config, mounts, volumes, the health probe."""
    pod = _parse(text)
    items = _config_items(pod)
    config_arg = _source(pod, items[0]) if items else None
    config_path = _scalar(items[0])[len(CONFIG_FLAG):] if items else None  # type: ignore[index]
    return ManifestInfo(
        image=_scalar(_get(pod.container, "image")) or "",
        config_arg=config_arg,
        config_path=config_path,
        kubeconfig=_flag_value(pod, "--kubeconfig"),
        mount_paths=tuple(_scalar(_get(m, "mountPath")) or "" for m in pod.mounts.value),
        volume_paths=tuple(_scalar(_get(_get(v, "hostPath"), "path")) or "" for v in pod.volumes.value),
        probe=_probe(pod.container),
        command=tuple(_scalar(item) or "" for item in _all_flags(pod)),
    )


# ---------------------------------------------------------------- editing

def _last_line(node: Any) -> int:
    """The last line holding any of the node's text."""
    if isinstance(node, yamlsupport.yaml.ScalarNode) or getattr(node, "flow_style", False):
        end = node.end_mark
        return end.line if end.column > 0 else end.line - 1
    children: List[Any] = []
    if isinstance(node, yamlsupport.yaml.MappingNode):
        for knode, vnode in node.value:
            children.extend((knode, vnode))
    else:
        children = list(node.value)
    return max([_last_line(child) for child in children] + [node.start_mark.line])


def _dash_prefix(pod: _Pod, item: Any, what: str) -> str:
    line = pod.lines[item.start_mark.line]
    prefix = line[:item.start_mark.column]
    if not _DASH_PREFIX.match(prefix):
        raise ManifestError("%s in the kube-scheduler manifest is not laid out one item per '- ' line; "
                            "refusing to edit it" % what)
    return prefix


def _plain(value: str) -> str:
    """A YAML scalar for ``value``: plain when unambiguous, else a JSON (double-quoted) string."""
    if _PLAIN_SAFE.match(value) and ": " not in value and not value.endswith(":"):
        return value
    import json
    return json.dumps(value)


def _render_item(prefix: str, pairs: List[Tuple[str, Any]], newline: str) -> List[str]:
    """A block mapping as a new ``- key: value`` list item, nested mappings indented by two."""
    out: List[str] = []
    pad = " " * len(prefix)

    def emit(indent: str, first: Optional[str], key: str, value: Any) -> None:
        lead = first if first is not None else indent
        if isinstance(value, list):
            out.append("%s%s:%s" % (lead, key, newline))
            for sub_key, sub_value in value:
                emit(indent + "  ", None, sub_key, sub_value)
        else:
            out.append("%s%s: %s%s" % (lead, key, value, newline))

    for index, (key, value) in enumerate(pairs):
        emit(pad, prefix if index == 0 else None, key, value)
    return out


class _Edits:
    """Line splices applied bottom-up so earlier positions stay valid."""

    def __init__(self, pod: _Pod) -> None:
        self.pod = pod
        self.ops: List[Tuple[int, int, Any]] = []     # (line, order, op)

    def insert_after(self, line: int, new_lines: List[str]) -> None:
        self.ops.append((line, 2, ("insert", line, new_lines)))

    def delete(self, first: int, last: int) -> None:
        self.ops.append((first, 1, ("delete", first, last)))

    def replace(self, node: Any, text: str) -> None:
        self.ops.append((node.start_mark.line, 0, ("replace", node.start_mark, node.end_mark, text)))

    def apply(self) -> str:
        lines = list(self.pod.lines)
        for _line, _order, op in sorted(self.ops, key=lambda o: (o[0], o[1]), reverse=True):
            if op[0] == "insert":
                at = op[1]
                if not lines[at].endswith(("\n", "\r")):
                    lines[at] += self.pod.newline
                lines[at + 1:at + 1] = op[2]
            elif op[0] == "delete":
                del lines[op[1]:op[2] + 1]
            else:
                start, end, text = op[1], op[2], op[3]
                if start.line != end.line:
                    raise ManifestError("a --config value spanning several lines cannot be edited safely")
                line = lines[start.line]
                lines[start.line] = line[:start.column] + text + line[end.column:]
        return "".join(lines)


def patch(text: str, config_path: str, volume_name: str = VOLUME_NAME) -> Tuple[str, Optional[str]]:
    """Point the scheduler at ``config_path``.

    Returns the new manifest and the source text of a ``--config`` it replaced
    (None when there was none, or when it already named ``config_path``).
    """
    pod = _parse(text)
    edits = _Edits(pod)
    previous: Optional[str] = None
    items = _config_items(pod)
    if items:
        if _scalar(items[0]) != CONFIG_FLAG + config_path:
            previous = _source(pod, items[0])
            edits.replace(items[0], _plain(CONFIG_FLAG + config_path))
    else:
        last = pod.flags.value[-1]
        prefix = _dash_prefix(pod, last, "the scheduler's command")
        edits.insert_after(_last_line(last), [prefix + _plain(CONFIG_FLAG + config_path) + pod.newline])

    volumes = _volume_items(pod, config_path)
    if volumes:
        name = _scalar(_get(volumes[0], "name")) or volume_name
    else:
        name = volume_name
        if any(_scalar(_get(v, "name")) == name for v in pod.volumes.value):
            raise ManifestError("the kube-scheduler manifest already has a volume named %r for another path" % name)
    if not _mount_items(pod, config_path):
        last = pod.mounts.value[-1]
        prefix = _dash_prefix(pod, last, "volumeMounts")
        edits.insert_after(_last_line(last), _render_item(
            prefix, [("mountPath", _plain(config_path)), ("name", _plain(name)), ("readOnly", "true")],
            pod.newline))
    if not volumes:
        last = pod.volumes.value[-1]
        prefix = _dash_prefix(pod, last, "volumes")
        edits.insert_after(_last_line(last), _render_item(
            prefix, [("hostPath", [("path", _plain(config_path)), ("type", "File")]), ("name", _plain(name))],
            pod.newline))
    return edits.apply(), previous


def unpatch(text: str, config_path: str, previous_arg: Optional[str] = None) -> str:
    """Remove what :func:`patch` added; put ``previous_arg`` back in place of our ``--config``."""
    pod = _parse(text)
    edits = _Edits(pod)
    for item in _config_items(pod):
        if _scalar(item) != CONFIG_FLAG + config_path:
            continue        # someone else's configuration: not ours to remove
        if previous_arg:
            edits.replace(item, previous_arg)
        else:
            _dash_prefix(pod, item, "the scheduler's command")
            edits.delete(item.start_mark.line, _last_line(item))
    for item in _mount_items(pod, config_path) + _volume_items(pod, config_path):
        _dash_prefix(pod, item, "volumeMounts/volumes")
        edits.delete(item.start_mark.line, _last_line(item))
    new = edits.apply()
    _parse(new)     # what we leave behind must still be a manifest we can read
    return new
