# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The kubelet's node-local APIs, for the agents that speak them, and the agents' metrics server.

``constants``       sockets and versions the kubelet defines
``grpc_api``        the guarded import of grpc and the kubelet API stubs (once)
``registration``    Register a device plugin with the kubelet
``podresources``    which devices the kubelet has assigned to containers
``pluginwatcher``   the plugin-registration server a DRA plugin offers the kubelet
``httpserve``       the agents' bounded HTTP server (/metrics, /healthz, the eviction guard)
``metrics``         the one metrics library (prometheus_client, guarded import) and the /metrics server

Used by gpu-device (``deviceplugin/``), gpu-dra (``dra/``) and gpu-exporter; neither imports the
other. The metrics library and server serve every agent (gpu-aware and operator-controller too).
The stubs themselves stay where their generator writes them (``deviceplugin/api/``,
``deviceplugin/gen_protos.sh``).
"""
