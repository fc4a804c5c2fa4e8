# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The one place the collection builds a Kubernetes client, and turns its failures into one line.

Everything that talks to the API server gets its client here (the ApiClient,
and the API calls over it: :func:`json_api`, also named :func:`core_v1`... at the call sites). Two
factories:

* :func:`api_client` for the in-cluster agents (``agents/common.kube_api_client``:
  the pod's service account, or a ``--kubeconfig`` file), the operator's
  ``clusteroperator/cluster.py`` and ``migrate.py``, and the rest of ``kube/``;
* :func:`module_client` for every module that talks to the API server
  (``kube_list``, ``node_metadata``, ``node_maintenance``, ``evict_gpu_pods``,
  ``driver``'s ``node_name``): kubernetes.core's connection options with their
  names, aliases, ``K8S_AUTH_*`` environment fallbacks and precedence (doc
  fragment ``metax.gpu.k8s_auth``, argument spec ``common.K8S_AUTH_ARGSPEC``).
  :class:`Auth` is the pure half (options and environment in, a checked value
  out); :func:`api_client_for` builds the client from it.

:func:`reaching` makes a connection failure or an API error one line naming
the server and the credentials' source. It imports nothing of the collection
but ``errors``, so every layer can use it. The ``kubernetes`` package is
optional for everything else in plugins/: the import is guarded and the
factories fail with a clear message when it is missing. kubernetes.core's own
code is not imported: the modules work without that collection.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Mapping, Optional, Set, Tuple, Union
from urllib.parse import urlsplit

from ..errors import MetaxGpuError

try:
    from kubernetes import client as k8s_client, config as k8s_config
    from kubernetes.client.exceptions import ApiException
    import urllib3  # the kubernetes client's transport
    HAS_KUBERNETES = True
except ImportError:
    k8s_client = k8s_config = urllib3 = None  # type: ignore[assignment]
    HAS_KUBERNETES = False

    class ApiException(Exception):  # type: ignore[no-redef]
        """Stand-in so ``except ApiException`` parses without the package."""

        status = 0
        reason = ""

__all__ = ["ApiException", "Auth", "HAS_KUBERNETES", "KubeClientError", "KubeApiError", "KubeConnectionError", "api_client",
           "api_client_for", "auth_from_params", "coordination_v1", "core_v1", "custom_objects", "json_api", "module_client",
           "reaching"]

MISSING = "the 'kubernetes' Python package is required (requirements/agents.txt)"


class KubeClientError(MetaxGpuError):
    """No usable Kubernetes configuration (package missing, no kubeconfig, not in a cluster)."""


def api_client(kubeconfig: Optional[str] = None) -> Any:
    """An ApiClient from a kubeconfig file, or the in-cluster service account."""
    if not HAS_KUBERNETES:
        raise KubeClientError(MISSING)
    configuration = k8s_client.Configuration()
    if kubeconfig:
        if not os.path.isfile(kubeconfig):
            raise KubeClientError("kubeconfig %s: no such file" % kubeconfig)
        try:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        except Exception as exc:  # pylint: disable=broad-except  # ConfigException, YAML errors, KeyError, TypeError...
            raise KubeClientError("kubeconfig %s is not usable: %s" % (kubeconfig, one_line(exc))) from exc
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException as exc:
            raise KubeClientError("no kubeconfig given and not running in a cluster: %s" % exc)
    return k8s_client.ApiClient(configuration)


# ---------------------------------------------------------------------------------------------
# The modules' connection: kubernetes.core's options (doc fragment metax.gpu.k8s_auth)

# option -> the kubernetes client's Configuration attribute, as kubernetes.core's AUTH_ARG_MAP: the
# environment fallback is K8S_AUTH_<OPTION>, then K8S_AUTH_<ATTRIBUTE> (K8S_AUTH_VERIFY_SSL, K8S_AUTH_SSL_CA_CERT...)
AUTH_ENV_NAMES = {
    "kubeconfig": "kubeconfig", "context": "context", "host": "host", "api_key": "api_key", "username": "username",
    "password": "password", "validate_certs": "verify_ssl", "ca_cert": "ssl_ca_cert", "client_cert": "cert_file",
    "client_key": "key_file", "proxy": "proxy", "no_proxy": "no_proxy", "persist_config": "persist_config",
    "impersonate_user": "impersonate_user", "impersonate_groups": "impersonate_groups",
}
AUTH_BOOLS = ("validate_certs", "persist_config")
PROXY_HEADER_KEYS = ("proxy_basic_auth", "basic_auth", "user_agent")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SOCKS = ("socks4", "socks4a", "socks5", "socks5h")     # the client's SOCKS proxies (PySocks)
# the credentials inside a kubeconfig given as a dictionary (masked in the module's output)
_KUBECONFIG_SECRETS = ("token", "password", "client-key-data", "id-token", "refresh-token", "client-secret",
                       "access-token")


def _env_bool(value: str) -> bool:
    # kubernetes.core's reading of a boolean K8S_AUTH_* variable
    return value.lower() not in ("0", "false", "no")


@dataclass(frozen=True)
class Auth:
    """The connection options of a module, environment fallbacks applied and checked; secrets never in repr."""

    host: Optional[str] = None
    api_key: Optional[str] = field(default=None, repr=False)
    kubeconfig: Union[str, Dict[str, Any], None] = field(default=None, repr=False)
    context: Optional[str] = None
    username: Optional[str] = None
    password: Optional[str] = field(default=None, repr=False)
    validate_certs: Optional[bool] = None
    ca_cert: Optional[str] = None
    client_cert: Optional[str] = None
    client_key: Optional[str] = field(default=None, repr=False)
    proxy: Optional[str] = None
    no_proxy: Optional[str] = None
    proxy_headers: Dict[str, str] = field(default_factory=dict, repr=False)
    persist_config: bool = False
    impersonate_user: Optional[str] = None
    impersonate_groups: Tuple[str, ...] = ()

    def self_sufficient(self) -> bool:
        """Enough to authenticate without a kubeconfig or the service account (kubernetes.core's rule)."""
        return bool(self.host and ((self.username and self.password) or self.api_key or (self.client_cert and self.client_key)))

    def describe(self) -> str:
        """Where the connection comes from, for one-line errors: names files and the host, never a secret."""
        if self.self_sufficient():
            how = "api_key" if self.api_key else "username/password" if self.username and self.password else "client_cert"
            return "host %s with %s" % (self.host, how)
        if isinstance(self.kubeconfig, dict):
            where = "kubeconfig given as a dictionary"
        elif self.kubeconfig:
            where = "kubeconfig %s" % self.kubeconfig
        elif self.context:
            where = "default kubeconfig (KUBECONFIG or ~/.kube/config)"
        else:
            where = "in-cluster service account, else KUBECONFIG or ~/.kube/config"
        return where + (", context %s" % self.context if self.context else "")

    def secrets(self) -> Set[str]:
        """Every secret this connection holds, the environment's and a kubeconfig dictionary's included:
        a module adds them to its no_log values (Ansible masks only the options it was given)."""
        found = {v for v in (self.api_key, self.password, self.client_key,
                             self.proxy_headers.get("proxy_basic_auth"), self.proxy_headers.get("basic_auth")) if v}
        if isinstance(self.kubeconfig, dict):
            found |= _secret_leaves(self.kubeconfig)
        return found


def _secret_leaves(value: Any) -> Set[str]:
    found: Set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key in _KUBECONFIG_SECRETS and isinstance(item, str) and item:
                found.add(item)
            else:
                found |= _secret_leaves(item)
    elif isinstance(value, list):
        for item in value:
            found |= _secret_leaves(item)
    return found


def auth_from_params(params: Mapping[str, Any], environ: Optional[Mapping[str, str]] = None) -> Auth:
    """The options a module was given, each unset one taken from K8S_AUTH_* as kubernetes.core does; checked.

    An empty string counts as not given. Raises KubeClientError naming the option (never a secret's value).
    """
    env = os.environ if environ is None else environ
    values: Dict[str, Any] = {}
    for option, attribute in AUTH_ENV_NAMES.items():
        value = params.get(option)
        if value is None or value == "" or value == []:
            raw = env.get("K8S_AUTH_" + option.upper()) or env.get("K8S_AUTH_" + attribute.upper())
            if raw is None or raw == "":
                continue
            if option in AUTH_BOOLS:
                value = _env_bool(raw)
            elif option == "impersonate_groups":
                value = [g for g in raw.split(",") if g != ""]
            else:
                value = raw
        values[option] = value
    headers = params.get("proxy_headers")
    if headers is None:
        headers = {k: env["K8S_AUTH_PROXY_HEADERS_" + k.upper()] for k in PROXY_HEADER_KEYS
                   if env.get("K8S_AUTH_PROXY_HEADERS_" + k.upper())}
    values["proxy_headers"] = {k: v for k, v in headers.items() if v not in (None, "")}
    values["impersonate_groups"] = tuple(values.get("impersonate_groups") or ())
    values["persist_config"] = bool(values.get("persist_config"))
    if values.get("host"):
        values["host"] = values["host"].rstrip("/")     # as kubernetes.core: https://api:6443/ works
    auth = Auth(**values)
    _check(auth)
    return auth


def _is_url(value: str, schemes: Tuple[str, ...]) -> bool:
    if _CONTROL.search(value) or " " in value:
        return False
    try:
        parts = urlsplit(value)
        _port = parts.port          # ValueError when not a number or out of range
    except ValueError:              # a bad port or IPv6 literal
        return False
    return parts.scheme in schemes and bool(parts.hostname)


def _check(auth: Auth) -> None:
    for option, schemes in (("host", ("http", "https")), ("proxy", ("http", "https") + _SOCKS)):
        value = getattr(auth, option)
        if value is None:
            continue
        if not _is_url(value, schemes):
            raise KubeClientError("%s %r is not a URL (%s)" % (option, value[:200], ", ".join(s + "://" for s in schemes)))
    # header values: a line break would end the header (the HTTP library refuses it mid-request)
    for option in ("api_key", "username", "password"):
        if _CONTROL.search(getattr(auth, option) or ""):
            raise KubeClientError("%s holds a line break or a control character" % option)
    for option, values in (("impersonate_user", [auth.impersonate_user or ""]), ("impersonate_groups", auth.impersonate_groups),
                           ("proxy_headers", list(auth.proxy_headers.values()))):
        if any(_CONTROL.search(v) for v in values):
            raise KubeClientError("%s holds a line break or a control character" % option)
    if auth.kubeconfig is not None and not isinstance(auth.kubeconfig, (str, dict)):
        raise KubeClientError("kubeconfig must be a path or a dictionary, not %s" % type(auth.kubeconfig).__name__)
    if isinstance(auth.kubeconfig, str) and "\0" in auth.kubeconfig:
        raise KubeClientError("kubeconfig %r is not a path" % auth.kubeconfig[:200])
    unknown = sorted(set(auth.proxy_headers) - set(PROXY_HEADER_KEYS))
    if unknown:
        raise KubeClientError("proxy_headers: unknown key(s) %s; known: %s" % (", ".join(unknown), ", ".join(PROXY_HEADER_KEYS)))
    for option in ("ca_cert", "client_cert"):
        path = getattr(auth, option)
        if path is not None and not os.path.isfile(path):
            raise KubeClientError("%s %s: no such file" % (option, path))
    if auth.client_key is not None and not os.path.isfile(auth.client_key):
        raise KubeClientError("client_key: no such file (its path is not shown: no_log)")


class _Repeatable(str):
    """A header name that compares equal only to itself, so the client's header dict can carry Impersonate-Group
    once per group (the API server reads each header line as one group; a comma-joined value is one group)."""

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other


def _load_kubeconfig(auth: Auth, configuration: Any) -> None:
    kwargs = {"context": auth.context, "client_configuration": configuration, "persist_config": auth.persist_config}
    if isinstance(auth.kubeconfig, dict):
        k8s_config.load_kube_config_from_dict(config_dict=auth.kubeconfig, **kwargs)
        return
    if auth.kubeconfig:
        # several files joined with ':' (';' on Windows), as KUBECONFIG: the client merges those that exist
        paths = [os.path.expanduser(p) for p in auth.kubeconfig.split(os.pathsep) if p]
        if not any(os.path.isfile(p) for p in paths):
            raise KubeClientError("kubeconfig %s: no such file" % auth.kubeconfig)
    # KUBECONFIG read now, not when the client was imported (it reads it once, at import)
    default = os.environ.get("KUBECONFIG") or "~/.kube/config"
    k8s_config.load_kube_config(config_file=auth.kubeconfig or default, **kwargs)


def api_client_for(auth: Auth) -> Any:
    """An ApiClient from the modules' options, with kubernetes.core's precedence.

    host with api_key, with username and password, or with client_cert and client_key is enough alone. Otherwise
    the kubeconfig (or the default one when only a context is given) is read; with neither, the in-cluster
    service account, then KUBECONFIG or ~/.kube/config. The options given then override what was loaded.
    """
    if not HAS_KUBERNETES:
        raise KubeClientError(MISSING)
    configuration = k8s_client.Configuration()
    try:
        if auth.self_sufficient():
            pass
        elif auth.kubeconfig or auth.context:
            _load_kubeconfig(auth, configuration)
        else:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
            except k8s_config.ConfigException:
                _load_kubeconfig(auth, configuration)
    except KubeClientError:
        raise
    except Exception as exc:  # pylint: disable=broad-except  # ConfigException, YAML errors, KeyError, TypeError...
        raise KubeClientError("%s is not usable: %s" % (auth.describe(), one_line(exc))) from exc
    _override(configuration, auth)
    _keep_overrides(configuration, auth)
    client = k8s_client.ApiClient(configuration)
    if auth.impersonate_user:
        client.set_default_header("Impersonate-User", auth.impersonate_user)
    for group in auth.impersonate_groups:
        client.set_default_header(_Repeatable("Impersonate-Group"), group)
    return client


def _override(configuration: Any, auth: Auth) -> None:
    if auth.host:
        configuration.host = auth.host
    if auth.api_key or (auth.username and auth.password):
        # the token loaded with the service account would otherwise be re-read over ours before each call
        configuration.refresh_api_key_hook = None
        if auth.api_key:
            configuration.api_key = {"authorization": "Bearer %s" % auth.api_key}
        else:
            # the client has no basic-auth setting of its own any more: the header, as its kubeconfig loader writes it
            configuration.api_key = {"authorization": urllib3.util.make_headers(
                basic_auth="%s:%s" % (auth.username, auth.password))["authorization"]}
        configuration.api_key_prefix = {}
    if auth.username is not None:
        configuration.username = auth.username
    if auth.password is not None:
        configuration.password = auth.password
    if auth.validate_certs is not None:
        configuration.verify_ssl = auth.validate_certs
    if auth.ca_cert:
        configuration.ssl_ca_cert = auth.ca_cert
    if auth.client_cert:
        configuration.cert_file = auth.client_cert
    if auth.client_key:
        configuration.key_file = auth.client_key
    if auth.proxy:
        configuration.proxy = auth.proxy
    if auth.no_proxy:
        configuration.no_proxy = auth.no_proxy
    if auth.proxy_headers:
        headers: Dict[str, Any] = dict(auth.proxy_headers)
        configuration.proxy_headers = urllib3.util.make_headers(**headers)


def _keep_overrides(configuration: Any, auth: Auth) -> None:
    """The kubeconfig loader's token hook runs before every request and writes the file's host, CA, certificates
    and token back: the options given are laid over them again each time (and the hook re-armed, as it re-arms itself)."""
    hook = configuration.refresh_api_key_hook
    if hook is None:
        return

    def refresh(conf: Any) -> None:
        hook(conf)      # may renew an expiring token (exec plugins, OIDC)
        _override(conf, auth)
        conf.refresh_api_key_hook = refresh
    configuration.refresh_api_key_hook = refresh


def module_client(module: Any) -> Tuple[Any, Auth]:
    """For a module: its Auth (options + K8S_AUTH_*), every secret of it registered as no_log, and the ApiClient.

    Raises KubeClientError (a MetaxGpuError) in one line, naming the option, host or kubeconfig.
    """
    auth = auth_from_params(module.params)
    module.no_log_values.update(auth.secrets())
    return api_client_for(auth), auth


class KubeConnectionError(KubeClientError):
    """The API server could not be reached (refused, unresolvable, timed out, TLS failed)."""


class KubeApiError(KubeClientError):
    """The API server answered with an error the caller did not handle (401, 403, 404...)."""


def one_line(exc: object, limit: int = 300) -> str:
    """An exception as one short line: the Kubernetes client's own messages run over several."""
    text = re.sub(r"\s+", " ", str(exc) or type(exc).__name__).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


@contextlib.contextmanager
def reaching(client: Any, kubeconfig: Union[str, Auth, None] = None) -> Iterator[None]:
    """Calls to the API server inside turn a connection failure into one line naming the server and the
    kubeconfig (a KubeConnectionError, a MetaxGpuError), instead of urllib3's traceback.

    ``kubeconfig``: the agents' kubeconfig path, or a module's :class:`Auth` (its :meth:`Auth.describe`)."""
    try:
        yield
    except ApiException as exc:
        if not getattr(exc, "status", None):
            raise _connection_error(client, kubeconfig, exc) from exc
        # the server answered (401 with a bad token, 403, 404...): its answer in one line, not the
        # client's multi-line dump of headers and body
        raise KubeApiError("the Kubernetes API server %s (%s) answered %s %s: %s" % (
            _host(client), _source(kubeconfig), exc.status, exc.reason or "", _api_message(exc))) from exc
    except Exception as exc:  # pylint: disable=broad-except
        if (urllib3 is not None and isinstance(exc, urllib3.exceptions.HTTPError)) or isinstance(exc, OSError):
            raise _connection_error(client, kubeconfig, exc) from exc
        raise


def _host(client: Any) -> str:
    return getattr(getattr(client, "configuration", None), "host", None) or "?"


def _source(kubeconfig: Union[str, Auth, None]) -> str:
    if isinstance(kubeconfig, Auth):
        return kubeconfig.describe()
    return "kubeconfig %s" % kubeconfig if kubeconfig else "in-cluster service account"


def _api_message(exc: Any) -> str:
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (TypeError, ValueError, AttributeError):
        message = None
    return one_line(message or exc.body or "")


def _connection_error(client: Any, kubeconfig: Union[str, Auth, None], exc: BaseException) -> KubeConnectionError:
    reason = getattr(exc, "reason", None) or exc    # MaxRetryError: the cause, not the URL and retry count
    return KubeConnectionError("cannot reach the Kubernetes API server %s (%s): %s"
                               % (_host(client), _source(kubeconfig), one_line(reason)))


def json_api(client: Any) -> Any:
    """The collection's API calls over an ApiClient from :func:`api_client`, as JSON (:class:`.rest.JsonApi`:
    no typed API class, whose model imports cost a second of CPU per process)."""
    if not HAS_KUBERNETES:
        raise KubeClientError(MISSING)
    from .rest import JsonApi  # pylint: disable=import-outside-toplevel  # rest imports this module
    return JsonApi(client)


# the groups' names at the call sites; one object serves them all
core_v1 = coordination_v1 = custom_objects = json_api
