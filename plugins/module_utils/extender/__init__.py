# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware: the topology-aware Kubernetes scheduler extender (manual 2.1.5, 2.2.3).

Pure parts: :mod:`.demand` (a pod's ``metax-tech.com/gpu`` demand),
:mod:`.nodeinfo` (what a Node publishes), :mod:`.policy` (filter, scores,
weights), :mod:`.wire` (ExtenderArgs in, results out). I/O at the edges:
:mod:`.cache` (list+watch), :mod:`.kube` (the Kubernetes client),
:mod:`.server` (HTTP). The process entrypoint is ``agents/gpu_aware.py``;
``docs/gpu-aware.md`` is the user documentation.
"""
