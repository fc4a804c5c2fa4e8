# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The kubelet device-plugin side of gpu-device.

``api/``            kubelet APIs (device plugin v1beta1, pod resources v1):
                    our .proto files and the committed generated stubs
                    (``gen_protos.sh`` regenerates them)
``constants``       names the kubelet and the cluster see
``devices``         the advertised device list and its health
``server``          the DevicePlugin gRPC service (Allocate & co.)
(registration and pod-resources are the kubelet's APIs: ``kubelet/``)
``annotations``     the node annotations (gpu-aware: all three; HAMi: the two topology tables only)
``metrics``         gpu-device's Prometheus metrics (served by ``kubelet/metrics``' server)
``vfio``            vfio-manager's DevicePlugin service of ``metax-tech.com/vfio-gpu``
"""
