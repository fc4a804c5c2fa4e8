# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Shared documentation of the host_root option of node-side modules."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  host_root:
    description:
      - Root of the node's filesystem where C(/sys), C(/dev) and C(mx-smi) are read.
      - C(/) on a real node. Point it at a simulated MetaX node (see C(docs/simulated-node.md))
        or at the host mount of a container.
    type: path
    default: /
"""
