# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Shared documentation of the kubeconfig option of the modules that talk to the API server."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Kubeconfig file; default the in-cluster service account.
    type: path
requirements:
  - kubernetes (Python package)
notes:
  - Authentication is a kubeconfig file only; the kubernetes.core auth options are not taken (see
    docs/design-decisions.md).
"""
