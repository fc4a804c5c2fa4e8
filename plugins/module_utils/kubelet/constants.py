# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Sockets and versions the kubelet defines (k8s.io/kubelet/pkg/apis)."""

from __future__ import annotations

# device-plugin API (deviceplugin/v1beta1)
API_VERSION = "v1beta1"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET_NAME = "kubelet.sock"

# pod-resources API (podresources/v1)
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
