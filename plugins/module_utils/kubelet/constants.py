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

# plugin registration (pluginregistration/v1): the kubelet's plugin watcher finds
# a plugin's registration socket in this directory (under the kubelet's root dir)
PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR = "/var/lib/kubelet/plugins"
PLUGIN_TYPE_DRA = "DRAPlugin"

# Dynamic Resource Allocation node API (dra/v1): the version string a plugin
# registers with names the gRPC service it implements
DRA_SERVICE_V1 = "v1.DRAPlugin"
