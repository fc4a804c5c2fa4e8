"""Every module, hostile input (issue 39, deliver 5 and 6): no traceback, nothing changed on a refusal, no secret out.

Sibling of test_argspecs.py. The modules are found in plugins/modules and their argument specs are read from
their own ``AnsibleModule(...)`` call, so a new module is covered without an edit here:

* each ``int``, ``str`` and ``path`` option gets generic hostile values; the run must end in exit_json or
  fail_json (an exception out of main() is the traceback a user would see), and a refused run must leave the
  temporary tree (host root, kubeconfig, sources) as it was;
* a module taking ``host_root`` refuses one that does not exist, and creates nothing;
* a module taking ``kubeconfig`` answers an unreachable API server and an unusable kubeconfig with one line
  naming the server or the file;
* such a module takes kubernetes.core's other connection options (doc fragment metax.gpu.k8s_auth): ``host`` +
  ``api_key`` alone or from K8S_AUTH_*, a context, a kubeconfig dictionary, certificate files; the answers are
  real (a local server that checks the bearer token) or one line without the secret;
* every option that holds a secret is ``no_log`` (found by name, suboptions too), and a marker put in each
  appears nowhere in the module's real output (result JSON with its invocation, warnings, diff).

The runs never touch this machine: ``host_root`` is always a temporary directory (a missing ``host_root``
means ``/`` to a module), ``kubeconfig`` points at a closed port (and KUBECONFIG too, with K8S_AUTH_* removed and
HOME under tmp_path: kubernetes.core's fallbacks never reach this machine's cluster), and path values stay under tmp_path.
"""
from __future__ import annotations

import base64
import glob
import importlib
import io
import json
import os
import re
import stat
import sys
from contextlib import redirect_stderr, redirect_stdout
from typing import Any, Dict, List, Tuple
from unittest import mock

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ports import free_port

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "modules"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scheduler"))
from module_runner import run_module, tree  # noqa: E402
from scheduler_support import manifest  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODULES = sorted(os.path.splitext(os.path.basename(p))[0]
                 for p in glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py")) if not p.endswith("__init__.py"))
MARKER = "MARKER-h7-secret-0c1d2e3f4a5b6c7d"
SECRET_NAME = re.compile(r"pass(word)?|secret|token|keydata|key_data|private|credential", re.I)

# What a module needs beyond its required options to get past its first check (None: leave the option out).
# A module not listed here gets generic values for its required options: still covered, less deeply.
BASE: Dict[str, Dict[str, Any]] = {
    "scheduler_extender": {"url": "http://10.96.12.34:8080", "wait": False},
    "maca": {"version": "2.23.0.4"},
    "driver": {"kubeconfig": None},
    "cdi_runtime": {"runtime_version": "1.7.24"},
    "registry_push": {"registry": "127.0.0.1:9/cloud", "plain_http": True},
    "offline_bundle": {"version": "0.1.0"},
    "node_metadata": {"prefix": "metax-tech.com/"},
    "kube_list": {"kind": "Node"},
    "evict_gpu_pods": {"node_name": "node-1"},
}

INT_VALUES = [-1, 0, 99999, 2 ** 31, -2 ** 63]
STR_VALUES = ["", " ", "a b", "../../escape", "-x", "--config=/etc/shadow", "x\ny", "$(touch escape)", "a\x00b",
              "x" * 5000]


LIST_VALUES = ["", "../../escape", "-x", "a\x00b", "a,b=c"]
# raw options (kubeconfig: a path or a dictionary)
RAW_VALUES: List[Any] = ["", "a\x00b", 7, ["x"], {}, {"apiVersion": "v1"}, "../../escape"]


def _path_values(tmp: str) -> List[str]:
    # relative values resolve under the test's cwd (tmp/a/cwd); absolute ones stay under tmp
    return ["", "relative/p", "../../escape", os.path.join(tmp, "a", "b", "..", "..", "escape"), "a\x00b"]


class _Spec(Exception):
    pass


def argspec(name: str) -> Tuple[Any, Dict[str, Any]]:
    """The module object and the keyword arguments of its AnsibleModule(...) call."""
    module = importlib.import_module("ansible_collections.metax.gpu.plugins.modules." + name)

    def capture(self, **kwargs):
        raise _Spec(kwargs)
    with mock.patch.object(basic.AnsibleModule, "__init__", capture), pytest.raises(_Spec) as info:
        module.main()
    return module, info.value.args[0]


def _generic(option: Dict[str, Any], tmp: str) -> Any:
    if option.get("choices"):
        return option["choices"][0]
    return {"str": "x", "path": os.path.join(tmp, "in"), "int": 1, "float": 1.0, "bool": False, "list": [],
            "dict": {}}.get(option.get("type", "str"), "x")


@pytest.fixture
def env(tmp_path, monkeypatch):
    """host root, unreachable kubeconfig, a cwd under tmp; returns (tmp, root, kubeconfig)."""
    tmp = str(tmp_path)
    root = tmp_path / "a" / "root"
    root.mkdir(parents=True)
    (tmp_path / "a" / "cwd").mkdir()
    monkeypatch.chdir(str(tmp_path / "a" / "cwd"))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_kubeconfig("https://127.0.0.1:%d" % free_port()))
    # kubernetes.core's fallbacks (K8S_AUTH_*, the service account, KUBECONFIG, ~/.kube/config) never reach
    # this machine's cluster: an option left out or empty ends at the unreachable kubeconfig
    for variable in list(os.environ):
        if variable.startswith("K8S_AUTH_") or variable.startswith("KUBERNETES_SERVICE_"):
            monkeypatch.delenv(variable)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("HOME", str(tmp_path / "a" / "home"))
    return tmp, str(root), str(kubeconfig)


def _kubeconfig(server: str) -> str:
    return ("apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n"
            "    server: %s\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context:\n    cluster: k\n"
            "    user: u\nusers:\n- name: u\n  user:\n    token: abc\n" % server)


def base_args(name: str, spec: Dict[str, Any], env) -> Dict[str, Any]:
    tmp, root, kubeconfig = env
    args: Dict[str, Any] = {}
    for option, desc in spec.items():
        if option == "host_root":
            args[option] = root             # never the default "/": this machine
        elif option == "kubeconfig":
            args[option] = kubeconfig
        elif desc.get("required"):
            args[option] = _generic(desc, tmp)
    for option, value in BASE.get(name, {}).items():
        if value is None:
            args.pop(option, None)
        else:
            args[option] = value
    if name == "scheduler_extender":
        path = os.path.join(root, "etc/kubernetes/manifests/kube-scheduler.yaml")
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as handle:
            handle.write(manifest("1.28"))
    return args


def _cases() -> List[Tuple[str, str, str, Any]]:
    out = []
    for name in MODULES:
        _module, kwargs = argspec(name)
        for option, desc in sorted(kwargs["argument_spec"].items()):
            kind = desc.get("type", "str")
            if desc.get("choices") or option == "host_root":
                continue        # choices: Ansible's own check; host_root: its own test below
            if kind == "int":
                out += [(name, option, kind, v) for v in INT_VALUES]
            elif kind == "str":
                out += [(name, option, kind, v) for v in STR_VALUES]
            elif kind == "path":
                out += [(name, option, kind, i) for i in range(5)]
            elif kind == "list" and desc.get("elements", "str") in ("str", "path") and not desc.get("options"):
                out += [(name, option, kind, [v]) for v in LIST_VALUES]
            elif kind == "raw":
                out += [(name, option, kind, v) for v in RAW_VALUES]
    return out


def _id(case) -> str:
    name, option, kind, value = case
    shown = value if kind not in ("str", "list", "raw") else (repr(value)[:12])
    return "%s-%s-%s" % (name, option, shown)


CASES = _cases()


def _run(module, args, check_mode=False, diff=False):
    """run_module, with an exception out of main() reported as the traceback it would be."""
    try:
        return run_module(module, args, check_mode=check_mode, diff=diff)
    except Exception as exc:  # noqa: BLE001 - the point: nothing may escape main()
        pytest.fail("%s ended in a traceback with %r: %s: %s" % (module.__name__, args, type(exc).__name__, exc))


def _snapshot(tmp: str) -> Dict[str, Any]:
    return {k: v for k, v in tree(tmp).items() if "/.cache" not in k}


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_hostile_value_is_refused_cleanly_or_taken(env, case):
    name, option, kind, value = case
    tmp, _root, _kubeconfig = env
    module, kwargs = argspec(name)
    args = base_args(name, kwargs["argument_spec"], env)
    args[option] = _path_values(tmp)[value] if kind == "path" else value
    before = _snapshot(tmp)
    for check_mode in (True, False):
        failed, result = _run(module, args, check_mode=check_mode)
        if failed:
            assert result.get("msg"), result
            assert "Traceback" not in result["msg"]
            assert _snapshot(tmp) == before, "%s refused %s=%r but changed files" % (name, option, args[option])
            assert not result.get("changed"), result
        if check_mode:
            assert _snapshot(tmp) == before, "%s in check mode changed files" % name
    if "host_root" in kwargs["argument_spec"]:
        # a node path stays under the host root (a controller module's path is taken as given)
        assert not os.path.exists(os.path.join(tmp, "escape")), "%s=%r wrote outside" % (option, args[option])


MODULES_WITH_HOST_ROOT = [n for n in MODULES if "host_root" in argspec(n)[1]["argument_spec"]]
MODULES_WITH_KUBECONFIG = [n for n in MODULES if "kubeconfig" in argspec(n)[1]["argument_spec"]]


@pytest.mark.parametrize("name", MODULES_WITH_HOST_ROOT)
def test_a_host_root_that_does_not_exist_is_refused(env, name):
    tmp, _root, _kubeconfig = env
    module, kwargs = argspec(name)
    args = base_args(name, kwargs["argument_spec"], env)
    missing = os.path.join(tmp, "no-such-root")
    args["host_root"] = missing
    before = _snapshot(tmp)
    for check_mode in (True, False):
        failed, result = _run(module, args, check_mode=check_mode)
        assert failed and missing in result["msg"], result
        assert _snapshot(tmp) == before and not os.path.exists(missing)


def _kube_args(name: str, env) -> Tuple[Any, Dict[str, Any]]:
    module, kwargs = argspec(name)
    args = base_args(name, kwargs["argument_spec"], env)
    if name == "driver":            # the driver module asks the API only about a node's pods
        args.update(node_name="node-1", state="absent")
    elif name in ("node_maintenance", "gpu_device_mode"):    # reads (and would patch) one node by name
        args.update(node_name="node-1")
    return module, args


@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_an_unreachable_api_server_is_one_line(env, name):
    _tmp, _root, kubeconfig = env
    module, args = _kube_args(name, env)
    args["kubeconfig"] = kubeconfig
    failed, result = _run(module, args, check_mode=True)
    assert failed, result
    assert "\n" not in result["msg"] and len(result["msg"]) < 600, result["msg"]
    assert kubeconfig in result["msg"] and "127.0.0.1" in result["msg"], result["msg"]


@pytest.fixture
def refusing_api():
    """An API server that answers every request 401, as one does to a revoked token."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "Unauthorized",
                               "reason": "Unauthorized", "code": 401}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_PATCH = do_POST = do_DELETE = do_GET  # noqa: N815

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_a_refusing_api_server_is_one_line(env, name, refusing_api):
    tmp = env[0]
    path = os.path.join(tmp, "refused-kubeconfig")
    with open(path, "w") as handle:
        handle.write(_kubeconfig(refusing_api))
    module, args = _kube_args(name, env)
    args["kubeconfig"] = path
    failed, result = _run(module, args, check_mode=True)
    assert failed, result
    assert "\n" not in result["msg"] and "401" in result["msg"], result["msg"]


@pytest.mark.parametrize("content", ["not: [valid", "apiVersion: v1\nkind: Config\n", "- a list\n",
                                     "apiVersion: v1\nkind: Config\ncurrent-context: nowhere\ncontexts: []\n"])
@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_an_unusable_kubeconfig_is_one_line(env, name, content):
    tmp, _root, _kubeconfig = env
    bad = os.path.join(tmp, "bad-kubeconfig")
    with open(bad, "w") as handle:
        handle.write(content)
    module, args = _kube_args(name, env)
    args["kubeconfig"] = bad
    failed, result = _run(module, args, check_mode=True)
    assert failed, result
    assert "\n" not in result["msg"] and bad in result["msg"], result["msg"]


# ---------------------------------------------------------------------------------------------
# kubernetes.core's connection options (doc fragment metax.gpu.k8s_auth)

TOKEN = "h14-bearer-9f8e7d6c5b4a"


@pytest.fixture
def token_api():
    """An API server that answers the modules' calls only with ``Authorization: Bearer TOKEN`` (401 otherwise);
    yields (url, the requests it saw as (path, authorization))."""
    import http.server
    import threading

    seen: List[Tuple[str, str]] = []
    resources = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": [
        {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node", "verbs": ["get", "list", "patch"]},
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": ["get", "list"]}]}
    node = {"metadata": {"name": "node-1", "resourceVersion": "7", "labels": {"metax-tech.com/gpu.installed": "true"}}}
    answers = {
        "/version": {"major": "1", "minor": "30", "gitVersion": "v1.30.0"},
        "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
        "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
        "/api/v1": resources,
        "/api/v1/nodes": {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}, "items": [node]},
        "/api/v1/pods": {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}, "items": []},
        # installed_scheme: the DaemonSets (no ClusterOperator CRD here: its 404 means none)
        "/apis/apps/v1/daemonsets": {"kind": "DaemonSetList", "apiVersion": "apps/v1",
                                     "metadata": {"resourceVersion": "9"}, "items": []},
        "/api/v1/nodes/node-1": dict(node, kind="Node", apiVersion="v1"),      # node_metadata's patch answer
        # node_maintenance waits for the paused agents' pods to go from the agents' namespace
        "/api/v1/namespaces/metax-gpu/pods": {"kind": "PodList", "apiVersion": "v1",
                                              "metadata": {"resourceVersion": "9"}, "items": []},
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))     # a PATCH's body
            path = self.path.split("?", 1)[0]
            seen.append((path, self.headers.get("Authorization", "")))
            if self.headers.get("Authorization") != "Bearer " + TOKEN:
                code, body = 401, {"kind": "Status", "status": "Failure", "message": "Unauthorized", "code": 401}
            elif path in answers:
                code, body = 200, answers[path]
            else:
                code, body = 404, {"kind": "Status", "status": "Failure", "message": "not found", "code": 404}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_PATCH = do_GET  # noqa: N815

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % server.server_address[1], seen
    server.shutdown()
    server.server_close()


def _token_args(name: str, env, host: str, token: str = TOKEN) -> Tuple[Any, Dict[str, Any]]:
    module, args = _kube_args(name, env)
    args.pop("kubeconfig", None)            # host and api_key alone, as a bastion with a token has them
    args.update(host=host, api_key=token)
    return module, args


@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_host_and_api_key_alone_reach_the_api_server(env, name, token_api):
    url, seen = token_api
    module, args = _token_args(name, env, url + "/")     # a trailing slash, as kubernetes.core strips it
    failed, result = _run(module, args, check_mode=True)
    assert seen and all(auth == "Bearer " + TOKEN for _path, auth in seen), seen
    paths = {path for path, _auth in seen}
    assert paths & {"/api/v1/nodes", "/api/v1/pods", "/api/v1/nodes/node-1", "/apis/apps/v1/daemonsets"}, paths
    if name == "installed_scheme":
        assert not failed and result["found"] == {"extensions": [], "operator": []} and result["refusal"] == "", result
    elif name == "kube_list":
        assert not failed and [n["metadata"]["name"] for n in result["resources"]] == ["node-1"], result
    elif name == "node_metadata":
        assert not failed and result["changed"] and result["nodes"][0]["name"] == "node-1", result
    elif name == "evict_gpu_pods":
        assert not failed and result["selected"] == [], result
    elif name == "node_maintenance":
        assert not failed and "/api/v1/nodes/node-1" in paths, result
    else:       # driver: the node's pods read with the token, nothing in use on an empty node
        assert not failed and result["in_use"] == [] and result["changed"] is False, result
    assert TOKEN not in json.dumps(result)


@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_the_environment_gives_host_and_api_key_as_kubernetes_core_reads_them(env, name, token_api, monkeypatch):
    url, seen = token_api
    module, args = _kube_args(name, env)
    args.pop("kubeconfig", None)
    monkeypatch.setenv("K8S_AUTH_HOST", url)
    monkeypatch.setenv("K8S_AUTH_API_KEY", TOKEN)
    failed, result = _run(module, args, check_mode=True)
    assert seen and all(auth == "Bearer " + TOKEN for _path, auth in seen), seen
    assert name == "driver" or not failed, result
    # and a secret from the environment is masked like an option's: Ansible does not know it is one
    text = _real_output(module, args, check_mode=True)
    assert text.strip() and TOKEN not in text


@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_a_wrong_token_is_one_line_without_the_token(env, name, token_api):
    url, _seen = token_api
    module, args = _token_args(name, env, url, token="h14-wrong-token-1a2b3c")
    failed, result = _run(module, args, check_mode=True)
    assert failed, result
    msg = result["msg"]
    assert "\n" not in msg and "401" in msg and url in msg and "api_key" in msg, msg
    assert "h14-wrong-token" not in json.dumps(result), result


@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_the_api_key_marker_never_shows_whether_the_server_refuses_or_answers(env, name, refusing_api, token_api):
    """The generic marker test stops at client_key's missing file: here the secrets go on the wire."""
    url, seen = token_api
    for host, token in ((refusing_api, MARKER), (url, TOKEN)):
        module, args = _token_args(name, env, host, token=token)
        args.update(username="u", password=MARKER, proxy_headers={"basic_auth": "u:" + MARKER, "user_agent": "ua"})
        for check_mode in (True, False):
            failed, result = _run(module, args, check_mode=check_mode, diff=True)
            assert failed == (host == refusing_api) or name == "driver", result
            assert not _leaks(json.dumps(result)) and TOKEN not in json.dumps(result), result
            text = _real_output(module, args, check_mode)
            assert text.strip() and not _leaks(text) and TOKEN not in text, text[:2000]
    assert seen and all(auth == "Bearer " + TOKEN for _path, auth in seen)      # api_key wins over basic auth


@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_an_unreachable_host_is_one_line_naming_it(env, name):
    url = "https://127.0.0.1:%d" % free_port()
    module, args = _token_args(name, env, url)
    failed, result = _run(module, args, check_mode=True)
    assert failed, result
    assert "\n" not in result["msg"] and url in result["msg"] and len(result["msg"]) < 600, result["msg"]
    assert TOKEN not in json.dumps(result)


@pytest.mark.parametrize("option", ["ca_cert", "client_cert", "client_key"])
@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_a_missing_certificate_file_is_one_line(env, name, option):
    tmp = env[0]
    missing = os.path.join(tmp, "no-such-" + option.replace("_", "-"))
    module, args = _kube_args(name, env)
    args[option] = missing
    failed, result = _run(module, args, check_mode=True)
    assert failed and option in result["msg"] and "\n" not in result["msg"], result
    # client_key is no_log: its path is not named
    assert (missing in result["msg"]) == (option != "client_key"), result["msg"]


@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_the_credentials_of_a_kubeconfig_dictionary_never_show(env, name, refusing_api):
    import yaml

    config = yaml.safe_load(_kubeconfig(refusing_api))
    config["users"][0]["user"]["token"] = MARKER
    module, args = _kube_args(name, env)
    args["kubeconfig"] = config
    failed, result = _run(module, args, check_mode=True)
    assert failed and "401" in result["msg"] and "dictionary" in result["msg"], result
    assert not _leaks(json.dumps(result))
    text = _real_output(module, args, check_mode=True)
    assert text.strip() and not _leaks(text), text[:2000]


@pytest.mark.parametrize("name", MODULES_WITH_KUBECONFIG)
def test_a_context_is_chosen_in_the_kubeconfig(env, name, token_api):
    """context (and K8S_AUTH_CONTEXT) picks one of the file's contexts, as in kubernetes.core."""
    import yaml

    tmp, _root, kubeconfig = env
    url, seen = token_api
    with open(kubeconfig) as handle:
        config = yaml.safe_load(handle)
    config["clusters"].append({"name": "good", "cluster": {"server": url}})
    config["users"].append({"name": "good", "user": {"token": TOKEN}})
    config["contexts"].append({"name": "good", "context": {"cluster": "good", "user": "good"}})
    path = os.path.join(tmp, "two-contexts")
    with open(path, "w") as handle:
        yaml.safe_dump(config, handle)
    module, args = _kube_args(name, env)
    args.update(kubeconfig=path, context="good")
    failed, result = _run(module, args, check_mode=True)
    assert seen and all(auth == "Bearer " + TOKEN for _path, auth in seen), seen
    assert name == "driver" or not failed, result
    args["context"] = "nowhere"
    failed, result = _run(module, args, check_mode=True)
    assert failed and "\n" not in result["msg"] and path in result["msg"] and "nowhere" in result["msg"], result


# ---------------------------------------------------------------------------------------------
# secrets

def _secret_options(spec: Dict[str, Any], prefix: str = "") -> List[Tuple[str, Dict[str, Any]]]:
    out = []
    for option, desc in spec.items():
        out.append((prefix + option, desc))
        if desc.get("options"):
            out += _secret_options(desc["options"], prefix + option + ".")
    return out


@pytest.mark.parametrize("name", MODULES)
def test_options_named_like_secrets_are_no_log(name):
    _module, kwargs = argspec(name)
    for path, desc in _secret_options(kwargs["argument_spec"]):
        leaf = path.rsplit(".", 1)[-1]
        if SECRET_NAME.search(leaf) and desc.get("type", "str") not in ("bool", "path"):
            assert desc.get("no_log") is True, "%s: option %s holds a secret: no_log=True" % (name, path)


def _with_marker(args: Dict[str, Any], spec: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """args with MARKER in every no_log option (suboptions of a dict option too); the options' paths."""
    marked: List[str] = []
    for option, desc in spec.items():
        if desc.get("no_log"):
            args[option] = MARKER
            marked.append(option)
        elif desc.get("type") == "dict" and desc.get("options"):
            sub = dict(args.get(option) or {})
            for sub_option, sub_desc in desc["options"].items():
                if sub_desc.get("no_log"):
                    sub[sub_option] = MARKER
                    marked.append(option + "." + sub_option)
            if sub:
                args[option] = sub
    return args, marked


def _real_output(module, args, check_mode: bool) -> str:
    """What Ansible receives: main() with the real exit_json/fail_json (no_log masking, invocation, warnings)."""
    full = dict(args, _ansible_check_mode=check_mode, _ansible_diff=True)
    out, err = io.StringIO(), io.StringIO()
    with patch_module_args(full), redirect_stdout(out), redirect_stderr(err):
        try:
            module.main()
        except SystemExit:
            pass
    return out.getvalue() + err.getvalue()


def _leaks(text: str) -> List[str]:
    forms = [MARKER, base64.b64encode(MARKER.encode()).decode(), MARKER[7:27]]
    return [f for f in forms if f in text]


@pytest.mark.parametrize("name", MODULES)
def test_no_secret_in_any_output(env, name):
    module, kwargs = argspec(name)
    spec = kwargs["argument_spec"]
    args, marked = _with_marker(base_args(name, spec, env), spec)
    if not marked:
        return      # nothing secret to give this module (test_options_named_like_secrets_are_no_log holds)
    for check_mode in (True, False):
        # our own result, before Ansible's masking: the secret must not be in it at all (diff included)
        _failed, result = _run(module, args, check_mode=check_mode, diff=True)
        assert not _leaks(json.dumps(result)), (name, marked, result)
        # and the real output
        text = _real_output(module, args, check_mode)
        assert text.strip(), "no output from %s" % name
        assert not _leaks(text), (name, marked, text[:2000])


def test_scheduler_extender_key_is_masked_and_its_files_are_0600(env):
    tmp, root, _kubeconfig = env
    module, kwargs = argspec("scheduler_extender")
    args = base_args("scheduler_extender", kwargs["argument_spec"], env)
    key = base64.b64encode(("-----BEGIN PRIVATE KEY-----\n%s\n-----END PRIVATE KEY-----\n" % (MARKER * 20)).encode())
    args["tls_config"] = {"keyData": key.decode(), "serverName": "gpu-aware"}
    args["enable_https"] = True
    failed, result = _run(module, args, diff=True)
    assert not failed, result
    after = result["diff"][1]["after"]
    assert "keyData: '******** (masked; sha256" in after and key.decode() not in json.dumps(result)
    assert "serverName: gpu-aware" in after
    config = os.path.join(root, "etc/metax/extender.yaml")
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600
    with open(config) as handle:
        assert key.decode() in handle.read()      # the file itself holds the key, for kube-scheduler
    backups = [os.path.join(d, f) for d, _s, fs in os.walk(os.path.join(root, "etc/kubernetes/metax-backup")) for f in fs]
    assert backups and all(stat.S_IMODE(os.stat(b).st_mode) == 0o600 for b in backups)


# ---------------------------------------------------------------------------------------------
# documentation

def _documented(module) -> Dict[str, Any]:
    """The options a module documents, its doc fragments' included."""
    import yaml

    doc = yaml.safe_load(module.DOCUMENTATION)
    options = dict(doc.get("options") or {})
    for fragment in doc.get("extends_documentation_fragment") or []:
        namespace, _sep, name = fragment.rpartition(".")
        assert namespace == "metax.gpu", fragment
        frag = importlib.import_module("ansible_collections.metax.gpu.plugins.doc_fragments." + name)
        options.update(yaml.safe_load(frag.ModuleDocFragment.DOCUMENTATION).get("options") or {})
    return options


def _compare(documented: Dict[str, Any], spec: Dict[str, Any], where: str) -> List[str]:
    problems = []
    if sorted(documented) != sorted(spec):
        problems.append("%s: documented %s, argument spec %s" % (where, sorted(documented), sorted(spec)))
    for option in set(documented) & set(spec):
        doc, arg = documented[option] or {}, spec[option]
        if doc.get("type", "str") != arg.get("type", "str"):
            problems.append("%s%s: documented type %s, spec %s" % (where, option, doc.get("type"), arg.get("type")))
        if doc.get("suboptions") or arg.get("options"):
            problems += _compare(doc.get("suboptions") or {}, arg.get("options") or {}, "%s%s." % (where, option))
    return problems


@pytest.mark.parametrize("name", MODULES)
def test_documented_options_are_the_argument_spec(name):
    """Suboptions too: a secret suboption (tls_config.keyData) is documented where its no_log is."""
    module, kwargs = argspec(name)
    assert _compare(_documented(module), kwargs["argument_spec"], "") == []
