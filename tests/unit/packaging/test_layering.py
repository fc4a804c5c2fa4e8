"""Import rules between the layers of plugins/module_utils.

* the library (everything but ``agents/``) never imports the agent entrypoints;
* nothing below the agents imports ``ansible.*`` (agents run without Ansible);
* third-party packages are imported only under ``try/except ImportError``.
"""
from __future__ import annotations

import ast
import os
import re
import sys

import pytest

MODULE_UTILS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "plugins", "module_utils")
STDLIB = set(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
# Third-party packages each file may import, guarded; generated gRPC stubs excepted.
GENERATED = ("_pb2.py", "_pb2_grpc.py", "gen_protos.py")


def _files():
    for dirpath, _dirs, files in os.walk(MODULE_UTILS):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, MODULE_UTILS), path


def _imports(path):
    """(module name, level, guarded) of every import in the file."""
    tree = ast.parse(open(path).read(), path)
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers):
            for inner in node.body:
                for sub in ast.walk(inner):
                    guarded.add(id(sub))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, 0, id(node) in guarded
        elif isinstance(node, ast.ImportFrom):
            yield node.module or "", node.level, id(node) in guarded


FILES = list(_files())


@pytest.mark.parametrize("rel, path", FILES, ids=[rel for rel, _path in FILES])
def test_import_rules(rel, path):
    in_agents = rel.startswith("agents" + os.sep)
    package = rel.split(os.sep)[:-1]
    for module, level, guarded in _imports(path):
        if level:
            # resolve against module_utils/: level 1 is this file's package
            target = package[:len(package) - (level - 1)] + (module.split(".") if module else [])
            assert in_agents or target[:1] != ["agents"], "%s imports the agent entrypoints (%s)" % (
                rel, ".".join(target))
            continue
        top = module.split(".")[0]
        assert in_agents or ".module_utils.agents" not in module, "%s imports %s" % (rel, module)
        assert top != "ansible", (
            "%s imports %s: module_utils are shared with the agents, which run without Ansible" % (rel, module))
        if top not in STDLIB and top != "ansible_collections" and not rel.endswith(GENERATED):
            assert guarded, "%s imports third-party %s without a try/except ImportError guard" % (rel, module)


# -- floors: which layer may import which ---------------------------------------
#
# Each rule names an inversion that once existed (issue 40) and fails if it comes back.
# Targets are dotted paths below plugins/module_utils ("driver.inuse"); plugins/filter
# modules are "filter:<name>".

PLUGINS = os.path.join(MODULE_UTILS, "..")
FILTERS = os.path.join(PLUGINS, "filter")
COLLECTION = "ansible_collections.metax.gpu.plugins."


def _targets(rel, path):
    """Dotted targets of every import in ``path`` (``rel`` below module_utils, or ``filter/x.py``)."""
    package = rel.split(os.sep)[:-1]
    for module, level, _guarded in _imports(path):
        if level:
            base = package[:len(package) - (level - 1)]
            if base[:1] == ["filter"]:
                yield "filter:" + module
                continue
            yield ".".join(base + (module.split(".") if module else []))
        elif module.startswith(COLLECTION + "module_utils."):
            yield module[len(COLLECTION + "module_utils."):]
        elif module.startswith(COLLECTION + "filter."):
            yield "filter:" + module[len(COLLECTION + "filter."):]


def _all_targets():
    out = [(rel, list(_targets(rel, path))) for rel, path in FILES]
    for name in sorted(os.listdir(FILTERS)):
        if name.endswith(".py"):
            rel = os.path.join("filter", name)
            out.append((rel, list(_targets(rel, os.path.join(FILTERS, name)))))
    return out


TARGETS = _all_targets()


def _under(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


def _violations(importers, forbidden, allowed=()):
    """(importer, target) pairs where a file under ``importers`` imports something under ``forbidden``."""
    found = []
    for rel, targets in TARGETS:
        dotted = rel[:-3].replace(os.sep, ".")
        if not any(_under(dotted, p) for p in importers):
            continue
        for target in targets:
            if any(_under(target, f) for f in forbidden) and not any(_under(target, a) for a in allowed):
                found.append((rel, target))
    return found


def test_floor_kube_imports_no_driver():
    """kube/ is the Kubernetes I/O layer under driver/: which pods hold GPUs is kube/pods."""
    assert _violations(["kube"], ["driver", "vfnum", "agents", "clusteroperator"]) == []


def test_floor_filter_plugins_import_no_filter_plugin():
    """Filter plugins share code through module_utils (node_checks, kube.pods, driver.rollout), never each other."""
    offenders = [(rel, t) for rel, targets in TARGETS if rel.startswith("filter" + os.sep)
                 for t in targets if t.startswith("filter:")]
    assert offenders == []


def test_floor_only_the_simulator_imports_the_simulator():
    """gpu/allocator_cli and everything shipped take no simulator import (sim/allocator_cli passes presets in)."""
    offenders = [(rel, t) for rel, targets in TARGETS if not rel.startswith("sim" + os.sep)
                 for t in targets if _under(t, "sim")]
    assert offenders == []


def test_floor_exporter_imports_no_device_plugin():
    """The exporter reads the kubelet and serves /metrics through kubelet/, not through gpu-device's package."""
    assert _violations(["exporter", "agents.gpu_exporter"], ["deviceplugin"]) == []


def test_floor_kubelet_is_below_the_agents_that_use_it():
    """kubelet/ serves gpu-device and gpu-exporter: it imports neither (only the generated stubs)."""
    assert _violations(["kubelet"], ["deviceplugin", "exporter", "agents"], allowed=["deviceplugin.api"]) == []


def test_floor_grpc_is_imported_once():
    """The guarded grpc import is kubelet/grpc_api's (and the generated stubs')."""
    importers = sorted(rel for rel, path in FILES
                       if not rel.endswith(GENERATED) and any(m.split(".")[0] == "grpc" for m, lvl, _g in _imports(path)
                                                              if not lvl))
    assert importers == [os.path.join("kubelet", "grpc_api.py")]


def _absolute_importers(top):
    """Files (below module_utils, generated stubs aside) with an absolute import of package ``top``."""
    return sorted(rel for rel, path in FILES if not rel.endswith(GENERATED)
                  and any(m.split(".")[0] == top for m, lvl, _g in _imports(path) if not lvl))


def test_floor_prometheus_client_is_imported_once():
    """One metrics library for every agent: prometheus_client, imported (guarded) by kubelet/metrics alone, so
    no agent starts a server of its own (``start_http_server``) or writes the exposition its own way."""
    assert _absolute_importers("prometheus_client") == [os.path.join("kubelet", "metrics.py")]


# gpu-aware's scheduler-facing server: keep-alive, TLS, request bodies in pools (its own bounds over
# httpbounds); its /metrics path serves the one library's exposition (ExtenderMetrics.exposition).
HTTP_SERVERS_ALLOWED = (os.path.join("kubelet", "httpserve.py"), os.path.join("extender", "server.py"))


def _serves_http(path):
    """Whether ``path`` imports the standard library's HTTP server (http.server, socketserver)."""
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import) and any(a.name == "http.server" or a.name.split(".")[0] == "socketserver"
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (
                node.module == "http.server" or (node.module or "").split(".")[0] == "socketserver"
                or (node.module == "http" and any(a.name == "server" for a in node.names))):
            return True
    return False


def test_floor_one_bounded_http_server_for_metrics_and_probes():
    """/metrics, /healthz and the eviction guard are kubelet/httpserve's bounded server (issue 39's bounds):
    nothing else builds on http.server or socketserver, so an unbounded server cannot come back."""
    assert sorted(rel for rel, path in FILES if _serves_http(path)) == sorted(HTTP_SERVERS_ALLOWED)


def test_the_metrics_floors_see_what_they_forbid(tmp_path):
    """The shapes the two rules above forbid (the operator-controller had the first and the last)."""
    for text in ("from prometheus_client import start_http_server\n", "import http.server\n",
                 "from http import server\n", "from socketserver import ThreadingMixIn\n"):
        path = tmp_path / "sample.py"
        path.write_text("try:\n    " + text + "except ImportError:\n    pass\n")
        found = any(m.split(".")[0] == "prometheus_client" for m, lvl, _g in _imports(str(path)) if not lvl)
        assert found or _serves_http(str(path)), text
    path.write_text("import http.client\nfrom http import HTTPStatus\n")
    assert not _serves_http(str(path))


def _string_constants(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def test_floor_open_device_users_is_written_once():
    """One /proc/<pid>/fd scan (gpu/users.py); driver/inuse and vfnum/backend word its results."""
    scanners = sorted(rel for rel, path in FILES if not rel.endswith(GENERATED)
                      and any(s.startswith("proc/") and s.endswith("/fd") for s in _string_constants(path)))
    assert scanners == [os.path.join("gpu", "users.py")]


# -- kube/ is the one Kubernetes I/O layer -----------------------------------------------------
#
# One list/watch (kube/watch.py), one raw JSON list and get (kube/pages.py), one path for node
# metadata (kube/node.py: our own node's keys, and the one routine that strips our keys).

def _plugin_files():
    """(path below plugins/, path) of every Python file in plugins/ (module_utils, modules, filters...)."""
    for dirpath, _dirs, files in os.walk(PLUGINS):
        for name in sorted(files):
            if name.endswith(".py") and not name.endswith(GENERATED):
                path = os.path.join(dirpath, name)
                yield os.path.normpath(os.path.relpath(path, PLUGINS)), path


PLUGIN_FILES = list(_plugin_files())
KUBE = os.path.join("module_utils", "kube") + os.sep


def _tree(path):
    return ast.parse(open(path).read(), path)


def _source(node):
    return ast.unparse(node) if hasattr(ast, "unparse") else ""


def _opens_a_watch(tree):
    """Lines where a file opens a watch of its own: the client's watch module, a call with ``watch=`` or
    ``allow_watch_bookmarks=``, or a URL with ``watch=true``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.startswith("kubernetes.watch") for a in node.names):
            yield node.lineno
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kubernetes") and (
                (node.module or "").endswith("watch") or any(a.name == "watch" for a in node.names)):
            yield node.lineno
        elif isinstance(node, ast.Call) and any(k.arg in ("watch", "allow_watch_bookmarks") for k in node.keywords):
            yield node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                "watch=true" in node.value.lower() or "watch=1" in node.value.lower()):
            yield node.lineno


def test_floor_one_watch_loop():
    """Only kube/watch.py opens a watch: every other module is a handler of its ListWatch."""
    offenders = sorted((rel, line) for rel, path in PLUGIN_FILES for line in _opens_a_watch(_tree(path))
                       if rel != os.path.join(KUBE, "watch.py"))
    assert offenders == []


# The rollout's node patches (labels and cordon, the maintenance protocol's, not only our keys):
# the planner's ``NodePatch`` bodies, applied as they are.
NODE_CALLS_ALLOWED = (os.path.join("module_utils", "clusteroperator", "cluster.py"),)


def _node_api_calls(tree):
    """Lines calling the client's Node API on a CoreV1Api (``core.read_node``, ``self.core.patch_node``...)."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("read_node", "patch_node", "patch_node_status", "replace_node")
                and _source(node.func.value).rsplit(".", maxsplit=1)[-1] == "core"):
            yield node.lineno


def test_floor_node_metadata_goes_through_kube_node():
    """Reads and patches of a Node outside kube/ go through kube/node.py (OwnNode, patch_metadata, strip)."""
    offenders = sorted((rel, line) for rel, path in PLUGIN_FILES for line in _node_api_calls(_tree(path))
                       if not rel.startswith(KUBE) and rel not in NODE_CALLS_ALLOWED)
    assert offenders == []


# the client's typed API classes: CoreV1Api, AppsV1Api, CoordinationV1Api, ResourceV1beta2Api, CustomObjectsApi...
TYPED_API = re.compile(r"^(?:[A-Z][A-Za-z]*V\d+(?:(?:alpha|beta)\d+)?|CustomObjects)Api$")


def _typed_api_uses(tree):
    """Lines naming one of the client's typed API classes (``CoreV1Api``, ``CustomObjectsApi``...)."""
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name is not None and TYPED_API.match(name):
            yield node.lineno


def test_floor_no_typed_api_class():
    """Every API call goes through kube/rest.JsonApi: a typed API class imports a model class per kind it
    names (kubernetes 37: over a second of CPU for CoreV1Api in every process that builds one)."""
    offenders = sorted((rel, line) for rel, path in PLUGIN_FILES for line in _typed_api_uses(_tree(path)))
    assert offenders == []


def _strips_keys(tree):
    """Lines building a merge patch that removes keys picked by prefix or pattern: ``{k: None for k in ...
    if k.startswith(...)}`` or ``if matches(k, ...)``."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.DictComp) and isinstance(node.value, ast.Constant) and node.value.value is None):
            continue
        for generator in node.generators:
            for condition in generator.ifs:
                calls = [c for c in ast.walk(condition) if isinstance(c, ast.Call)]
                if any((isinstance(c.func, ast.Attribute) and c.func.attr == "startswith")
                       or (isinstance(c.func, ast.Name) and c.func.id == "matches") for c in calls):
                    yield node.lineno


def test_floor_one_strip_routine():
    """Our keys are stripped from nodes by kube/node.py's strip routine alone."""
    offenders = sorted((rel, line) for rel, path in PLUGIN_FILES for line in _strips_keys(_tree(path))
                       if rel != os.path.join(KUBE, "node.py"))
    assert offenders == []


def _reads_raw_json(tree):
    """Lines decoding a raw client answer themselves: ``json.loads(<x>.data)``."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and _source(node.func) == "json.loads" and node.args
                and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "data"):
            yield node.lineno


def test_floor_one_raw_json_reader():
    """Raw answers (``_preload_content=False``) are read by kube/pages.py (raw_list, raw_get, raw_json), which
    gives every connection back to the pool."""
    offenders = sorted((rel, line) for rel, path in PLUGIN_FILES for line in _reads_raw_json(_tree(path))
                       if rel != os.path.join(KUBE, "pages.py"))
    assert offenders == []


def test_the_floor_rules_see_what_they_forbid():
    """Each rule finds the shape it forbids (else a rule that sees nothing would pass for ever)."""
    sample = ast.parse(
        "from kubernetes import watch\n"
        "core.list_node(watch=True)\n"
        "url = '/api/v1/nodes?watch=true'\n"
        "self.core.patch_node(name, body)\n"
        "patch = {k: None for k in labels if k.startswith(PREFIX)}\n"
        "drop = {k: None for k in labels if matches(k, patterns)}\n"
        "found = json.loads(resp.data)\n")
    assert list(_opens_a_watch(sample)) == [1, 2, 3]
    assert list(_node_api_calls(sample)) == [4]
    assert sorted(_strips_keys(sample)) == [5, 6]
    assert list(_reads_raw_json(sample)) == [7]
    harmless = ast.parse("self.api.patch_node({}, {})\nout = {k: None for k in before if k not in after}\n")
    assert not list(_node_api_calls(harmless)) and not list(_strips_keys(harmless))


# gpu-aware's scheduling arithmetic: how many devices a pod asks for (requests and limits, init
# containers' maximum), not whether it holds any.
POD_RESOURCES_ALLOWED = (os.path.join("module_utils", "extender", "demand.py"),)


def test_floor_which_pods_hold_gpus_is_kube_pods():
    """Only kube/pods.py reads a pod's containers' limits and requests or its finished phases: the eviction,
    driver-manager, the driver's in-use check and the vfnum filter ask it."""
    readers = sorted(rel for rel, path in PLUGIN_FILES if not rel.startswith("modules" + os.sep)
                     and any(s in ("limits", "Succeeded") for s in _string_constants(path)))
    assert readers == sorted((os.path.join(KUBE, "pods.py"),) + POD_RESOURCES_ALLOWED)
