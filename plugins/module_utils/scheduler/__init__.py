# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Enable the gpu-aware extender in a kubeadm static-pod kube-scheduler (manual section 2.1.5).

``config``: the KubeSchedulerConfiguration (extender entry, apiVersion table,
validation as the scheduler does it, merge into an existing configuration).
``manifest``: text-preserving edits of the static pod manifest (``--config``,
the hostPath volume and its mount), so that removing puts back the original
bytes. Pure functions; the module does the I/O.
"""
