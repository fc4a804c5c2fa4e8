"""Argument specs and doc fragments come in pairs: same options, types and defaults.

A doc fragment ``plugins/doc_fragments/<name>.py`` documents exactly the
options of ``<NAME>_ARGSPEC`` in ``plugins/module_utils/common.py``; modules
compose the spec with copy.deepcopy and extend the fragment by name.
"""
from __future__ import annotations

import glob
import importlib
import os

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils import common

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FRAGMENTS = sorted(os.path.splitext(os.path.basename(p))[0]
                   for p in glob.glob(os.path.join(ROOT, "plugins", "doc_fragments", "*.py"))
                   if not p.endswith("__init__.py"))


def _agree(documented, spec, where=""):
    assert sorted(documented) == sorted(spec), where
    for option, doc in documented.items():
        arg = spec[option]
        assert doc.get("type", "str") == arg.get("type", "str"), where + option
        assert doc.get("default") == arg.get("default"), where + option
        assert doc.get("elements") == arg.get("elements"), where + option
        assert sorted(doc.get("aliases") or []) == sorted(arg.get("aliases") or []), where + option
        # no_log is not a documentation key (validate-modules refuses it): the description says it instead
        text = " ".join(doc["description"]) if isinstance(doc["description"], list) else doc["description"]
        assert ("C(no_log)" in text) == bool(arg.get("no_log")), where + option
        if doc.get("suboptions") or arg.get("options"):
            _agree(doc.get("suboptions") or {}, arg.get("options") or {}, where + option + ".")


@pytest.mark.parametrize("name", FRAGMENTS)
def test_fragment_and_argspec_agree(name):
    fragment = importlib.import_module("ansible_collections.metax.gpu.plugins.doc_fragments." + name)
    documented = yaml.safe_load(fragment.ModuleDocFragment.DOCUMENTATION)["options"]
    spec = getattr(common, name.upper() + "_ARGSPEC")
    _agree(documented, spec)


def _kubernetes_core():
    """kubernetes.core's own auth spec and doc fragment (the installed collection: read by the test, never by plugins/)."""
    args = pytest.importorskip("ansible_collections.kubernetes.core.plugins.module_utils.args_common")
    frag = importlib.import_module("ansible_collections.kubernetes.core.plugins.doc_fragments.k8s_auth_options")
    return args, yaml.safe_load(frag.ModuleDocFragment.DOCUMENTATION)["options"]


# deliberate: client_key is no_log here (kubernetes.core leaves it shown); kubeconfig is not no_log (its path is
# named in one-line errors) and module_client masks the credentials of a kubeconfig given as a dictionary instead
NO_LOG_DIFFERENCES = {"client_key": True, "kubeconfig": False}


def test_auth_options_are_kubernetes_core_s():
    args, documented = _kubernetes_core()
    theirs, ours = args.AUTH_ARG_SPEC, common.K8S_AUTH_ARGSPEC
    assert sorted(ours) == sorted(theirs) == sorted(documented)
    for option, spec in theirs.items():
        assert ours[option].get("type", "str") == spec.get("type", "str"), option
        assert ours[option].get("elements") == spec.get("elements"), option
        assert sorted(ours[option].get("aliases") or []) == sorted(spec.get("aliases") or []), option
        expected = NO_LOG_DIFFERENCES.get(option, bool(spec.get("no_log")))
        assert bool(ours[option].get("no_log")) == expected, option
    sub = common.K8S_AUTH_PROXY_HEADERS_ARGSPEC
    assert sorted(sub) == sorted(args.AUTH_PROXY_HEADERS_SPEC)
    for option, spec in args.AUTH_PROXY_HEADERS_SPEC.items():
        assert bool(sub[option].get("no_log")) == bool(spec.get("no_log")), option


def test_auth_environment_fallbacks_are_kubernetes_core_s():
    """Each option falls back to K8S_AUTH_<OPTION>, then K8S_AUTH_<client attribute> (their AUTH_ARG_MAP)."""
    from ansible_collections.metax.gpu.plugins.module_utils.kube.client import AUTH_ENV_NAMES, PROXY_HEADER_KEYS

    args, _documented = _kubernetes_core()
    theirs = {option: attribute for attribute, option in args.AUTH_ARG_MAP.items() if option != "proxy_headers"}
    theirs.update(impersonate_user="impersonate_user", impersonate_groups="impersonate_groups")
    assert AUTH_ENV_NAMES == theirs
    assert sorted(PROXY_HEADER_KEYS) == sorted(args.AUTH_PROXY_HEADERS_SPEC)


def test_the_auth_fragment_names_every_environment_variable():
    from ansible_collections.metax.gpu.plugins.doc_fragments.k8s_auth import ModuleDocFragment

    text = ModuleDocFragment.DOCUMENTATION
    for variable in ("K8S_AUTH_HOST", "K8S_AUTH_API_KEY", "K8S_AUTH_KUBECONFIG", "K8S_AUTH_CONTEXT", "K8S_AUTH_USERNAME",
                     "K8S_AUTH_PASSWORD", "K8S_AUTH_CERT_FILE", "K8S_AUTH_KEY_FILE", "K8S_AUTH_SSL_CA_CERT",
                     "K8S_AUTH_VERIFY_SSL", "K8S_AUTH_PROXY", "K8S_AUTH_NO_PROXY", "K8S_AUTH_PERSIST_CONFIG",
                     "K8S_AUTH_IMPERSONATE_USER", "K8S_AUTH_IMPERSONATE_GROUPS", "K8S_AUTH_PROXY_HEADERS_PROXY_BASIC_AUTH",
                     "K8S_AUTH_PROXY_HEADERS_BASIC_AUTH", "K8S_AUTH_PROXY_HEADERS_USER_AGENT"):
        assert "E(%s)" % variable in text, variable


def test_every_module_that_talks_to_kubernetes_takes_the_auth_options():
    """A module that builds a Kubernetes client does it through module_client, with the fragment and the spec."""
    for path in glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py")):
        with open(path) as handle:
            text = handle.read()
        name = os.path.basename(path)
        talks = "module_utils.kube" in text and ("core_v1" in text or "DynamicClient" in text or "module_client" in text)
        if not talks:
            continue
        assert "metax.gpu.k8s_auth" in text, name
        assert "K8S_AUTH_ARGSPEC" in text and "module_client(module)" in text, name
        assert "api_client(" not in text, name


def test_action_group_node_lists_the_modules_taking_host_root():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as handle:
        runtime = yaml.safe_load(handle)
    node = set(runtime["action_groups"]["node"])
    taking_host_root = set()
    for path in glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py")):
        with open(path) as handle:
            if "metax.gpu.host_root" in handle.read():
                taking_host_root.add(os.path.splitext(os.path.basename(path))[0])
    assert node == taking_host_root
