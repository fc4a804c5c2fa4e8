# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Shared documentation of the connection options of the modules that talk to the API server.

kubernetes.core's options (its doc fragment ``kubernetes.core.k8s_auth_options``): same names, types, aliases,
K8S_AUTH_* fallbacks and precedence. Paired with ``module_utils/common.K8S_AUTH_ARGSPEC``; read by
``module_utils/kube/client.py`` (``module_client``).
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  host:
    description:
      - URL of the API server, C(https://HOST:PORT). Can also be specified via the E(K8S_AUTH_HOST) environment variable.
      - With O(api_key), with O(username) and O(password), or with O(client_cert) and O(client_key), no kubeconfig
        and no service account is read.
    type: str
  api_key:
    description:
      - Bearer token used to authenticate with the API (a ServiceAccount token, for example). Can also be specified
        via the E(K8S_AUTH_API_KEY) environment variable.
      - Never shown in the module's output (C(no_log)), also when it comes from the environment.
    type: str
  kubeconfig:
    description:
      - Path to an existing Kubernetes config file. If not provided, and no other connection options are provided,
        the in-cluster service account is used, else the file named by E(KUBECONFIG) or C(~/.kube/config). Can also
        be specified via the E(K8S_AUTH_KUBECONFIG) environment variable.
      - Several files can be given, separated by C(:) (C(;) on Windows), as in E(KUBECONFIG).
      - The configuration can also be given as a dictionary; its tokens, passwords and keys are then never shown in
        the module's output.
    type: raw
  context:
    description:
      - The name of a context found in the config file. Can also be specified via the E(K8S_AUTH_CONTEXT) environment
        variable.
    type: str
  username:
    description:
      - Username for HTTP basic authentication with the API. Can also be specified via the E(K8S_AUTH_USERNAME)
        environment variable.
      - Only for API servers configured for basic authentication (Kubernetes itself removed it in 1.19).
    type: str
  password:
    description:
      - Password for HTTP basic authentication with the API, with O(username). Can also be specified via the
        E(K8S_AUTH_PASSWORD) environment variable.
      - Never shown in the module's output (C(no_log)).
    type: str
  client_cert:
    description:
      - Path to a certificate used to authenticate with the API. Can also be specified via the E(K8S_AUTH_CERT_FILE)
        environment variable.
    type: path
    aliases: [cert_file]
  client_key:
    description:
      - Path to the key file of O(client_cert). Can also be specified via the E(K8S_AUTH_KEY_FILE) environment
        variable.
      - Its path is never shown in the module's output (C(no_log)).
    type: path
    aliases: [key_file]
  ca_cert:
    description:
      - Path to a CA certificate used to verify the API server. The full certificate chain must be provided to
        avoid certificate validation errors. Can also be specified via the E(K8S_AUTH_SSL_CA_CERT) environment
        variable.
    type: path
    aliases: [ssl_ca_cert]
  validate_certs:
    description:
      - Whether or not to verify the API server's SSL certificates. Can also be specified via the
        E(K8S_AUTH_VERIFY_SSL) environment variable.
    type: bool
    aliases: [verify_ssl]
  proxy:
    description:
      - The URL of an HTTP proxy to use for the connection. Can also be specified via the E(K8S_AUTH_PROXY)
        environment variable.
      - The usual proxy variables of the environment (E(HTTP_PROXY)) are not read.
    type: str
  no_proxy:
    description:
      - Comma separated hosts, domains, IP addresses and CIDR blocks that do not go through O(proxy). Can also be
        specified via the E(K8S_AUTH_NO_PROXY) environment variable.
    type: str
  proxy_headers:
    description:
      - Headers sent to O(proxy).
    type: dict
    suboptions:
      proxy_basic_auth:
        description:
          - Colon-separated username:password for proxy basic authentication. Can also be specified via the
            E(K8S_AUTH_PROXY_HEADERS_PROXY_BASIC_AUTH) environment variable.
          - Never shown in the module's output (C(no_log)).
        type: str
      basic_auth:
        description:
          - Colon-separated username:password for a basic authentication header. Can also be specified via the
            E(K8S_AUTH_PROXY_HEADERS_BASIC_AUTH) environment variable.
          - Never shown in the module's output (C(no_log)).
        type: str
      user_agent:
        description:
          - The user agent, such as C(foo/1.0). Can also be specified via the E(K8S_AUTH_PROXY_HEADERS_USER_AGENT)
            environment variable.
        type: str
  persist_config:
    description:
      - Whether or not to save refreshed tokens (OIDC, exec plugins) back into the kubeconfig file. Can also be
        specified via the E(K8S_AUTH_PERSIST_CONFIG) environment variable. Default false.
    type: bool
  impersonate_user:
    description:
      - Username to impersonate for the operation. Can also be specified via the E(K8S_AUTH_IMPERSONATE_USER)
        environment variable.
    type: str
  impersonate_groups:
    description:
      - Groups to impersonate for the operation. Can also be specified via the E(K8S_AUTH_IMPERSONATE_GROUPS)
        environment variable, comma separated (C(Group1,Group2)).
    type: list
    elements: str
requirements:
  - kubernetes (Python package)
notes:
  - The options, aliases, environment variables and precedence are kubernetes.core's (C(kubernetes.core.k8s_auth_options)),
    so the same connection settings serve C(kubernetes.core) tasks and this module; the kubernetes.core collection
    itself is not needed. See docs/authentication.md.
  - To avoid SSL certificate validation errors when O(validate_certs) is true, the full certificate chain for the
    API server must be provided via O(ca_cert) or in the kubeconfig file.
"""
