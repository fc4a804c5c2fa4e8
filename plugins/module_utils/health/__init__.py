# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""GPU health that an administrator can act on (issue 42, docs/health.md).

``signals``   the signals, one definition of their names and kinds (pure)
``eid``       EIDs from the kernel log: the pattern, the log's tail, counts per GPU
``reader``    one health reading of a node: mx-smi ``-j`` and ``--count-ecc``, the kernel log
``policy``    the policy table, its shipped defaults and the document a cluster changes it with (pure)
``evaluate``  the policy over readings in time: hold-off, recovery, the decision (pure)
``node``      the Node's MetaXGPUHealthy condition, the quarantine taint and the Events
``monitor``   what gpu-device's health loop calls

Node-side: standard library only (the kubernetes client is passed in).
"""
