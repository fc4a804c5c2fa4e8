# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The components the GPU Operator deploys today, in chain order.

The chain follows MetaX's operator 0.9.2 (samples/kubernetes/operator-0.9.2-daemonsets.txt):
container-runtime on GPU nodes; driver and MACA after ``runtime.ready``;
gpu-device after ``maca.ready`` and ``runtime.ready``; gpu-label everywhere.
gpu-exporter (the CR's ``dataExporter``, MetaX's mx-exporter) after
``driver.ready``: it reads mx-smi, which needs the loaded driver.
container-runtime (the CR's ``runtime``, off unless deployed) owns ``runtime.ready``;
the driver component (the CR's ``driver``, driver-manager) owns ``driver.ready``;
the MACA component (the CR's ``maca``, maca-manager) owns ``maca.ready``, which
gpu-device requires (the chain skips it while the MACA component is off).
A new component is one more :class:`Component` in :data:`REGISTRY`.
"""

from __future__ import annotations

from typing import Dict, Tuple

from .. import names
from .contract import Component

EXTENSIONS_CHART = "metax-gpu-extensions"

GPU_LABEL = Component(
    name=names.DAEMONSET_GPU_LABEL, spec_key="labelgen", values_key="gpuLabel", chart=EXTENSIONS_CHART,
    image="gpu-label", minimal=True,
    # Table 2.7: gpu.* and driver.ready (gpu-label reports the loaded driver)
    cleanup_labels=(names.LABEL_PREFIX + "gpu.", names.LABEL_DRIVER_READY),
)

CONTAINER_RUNTIME = Component(
    name=names.DAEMONSET_CONTAINER_RUNTIME, spec_key="runtime", values_key="runtime", chart=EXTENSIONS_CHART,
    image="container-runtime", gpu_nodes_only=True, default_deploy=True,  # on by default, as the real product (issue 38)
    # makes the node's runtime read CDI; gpu-device (which requires it) then answers with CDI names
    ready_label=names.LABEL_RUNTIME_READY,
    enable_values={"containerRuntime": {"enabled": True}},
)

GPU_DEVICE = Component(
    name=names.DAEMONSET_GPU_DEVICE, spec_key="devicePlugin", values_key="gpuDevice", chart=EXTENSIONS_CHART,
    image="gpu-device", minimal=True, gpu_nodes_only=True,
    requires=(names.LABEL_MACA_READY, names.LABEL_RUNTIME_READY),
    cleanup_annotations=names.ANNOTATION_KEYS,
)

GPU_AWARE = Component(
    name="gpu-aware", spec_key="gpuAware", values_key="gpuAware", chart=EXTENSIONS_CHART,
    image="gpu-aware", kind="Deployment", default_deploy=False,
    enable_values={"deployExtenderGPUAware": True},
)

GPU_EXPORTER = Component(
    name=names.DAEMONSET_GPU_EXPORTER, spec_key="dataExporter", values_key="dataExporter", chart=EXTENSIONS_CHART,
    image="gpu-exporter", default_deploy=False, gpu_nodes_only=True,
    # reads mx-smi, which answers only with the driver loaded; writes nothing to nodes
    requires=(names.LABEL_DRIVER_READY,),
)

# The driver component (issue 25): driver-manager installs the kernel driver from
# the payload image and applies driver-config; it runs after runtime.ready, as
# the real metax-driver (skipped while no component owns runtime.ready), and
# owns driver.ready (the controller sets it: one writer, docs/design-decisions.md).
DRIVER = Component(
    name=names.DAEMONSET_DRIVER, spec_key="driver", values_key="driver", chart=EXTENSIONS_CHART,
    image="driver-manager", ready_label=names.LABEL_DRIVER_READY, requires=(names.LABEL_RUNTIME_READY,),
    gpu_nodes_only=True, default_deploy=True,  # on by default, as the real product (issue 38)
    # the rolling upgrade's marks (driver-manager's and the controller's) go with the component
    cleanup_labels=(names.LABEL_DRIVER_MODE, names.LABEL_VFNUM_STATE, names.LABEL_DRIVER_UPGRADE_STATE),
    cleanup_annotations=(names.ANNOTATION_DRIVER_MESSAGE, names.ANNOTATION_VFNUM_MESSAGE,
                         names.ANNOTATION_DRIVER_UPGRADE_MESSAGE, names.ANNOTATION_DRIVER_UPGRADE_TARGET,
                         names.ANNOTATION_PRE_CORDONED, names.ANNOTATION_DRIVER_UPGRADE_IN_PLACE,
                         names.ANNOTATION_DRIVER_PAYLOAD_VERSION, names.ANNOTATION_DRIVER_PAYLOAD_DRIVER,
                         names.ANNOTATION_MAINTENANCE_OWNER),
    # a failed upgrade is Degraded too, naming the node and why, until the administrator clears it
    # (an in-place upgrade waiting for idle GPUs, "pending: ...", is not: status.node_messages)
    message_annotations=(names.ANNOTATION_DRIVER_MESSAGE, names.ANNOTATION_VFNUM_MESSAGE,
                         names.ANNOTATION_DRIVER_UPGRADE_MESSAGE),
)

# The MACA component (issue 25): maca-manager (in the driver-manager image, as the
# real metax-maca) copies MXMACA from the payload image of the node's product to
# /opt/maca-<version> and switches /opt/maca (maca/install.py, the maca_host
# role's code); after runtime.ready, as the real one. It writes nothing on the
# Node: maca.ready is the controller's, from its pod's readiness.
MACA = Component(
    name=names.DAEMONSET_MACA, spec_key="maca", values_key="maca", chart=EXTENSIONS_CHART,
    image="driver-manager", ready_label=names.LABEL_MACA_READY, requires=(names.LABEL_RUNTIME_READY,),
    gpu_nodes_only=True, default_deploy=True,  # on by default, as the real product (issue 38)
)

# gpu-dra (issue 41, docs/dra.md): the DRA driver gpu.metax-tech.com and its DeviceClasses,
# on the GPU nodes labelled metax-tech.com/gpu.device-mode=dra (the chart's nodeAffinity;
# gpu-device leaves them); after maca.ready and runtime.ready, as gpu-device. Off unless deployed.
GPU_DRA = Component(
    name=names.DAEMONSET_GPU_DRA, spec_key="draDriver", values_key="draDriver", chart=EXTENSIONS_CHART,
    image="gpu-dra", default_deploy=False, gpu_nodes_only=True,
    requires=(names.LABEL_MACA_READY, names.LABEL_RUNTIME_READY),
)

# GPUs for virtual machines (issue 43): vfio-manager hands the GPUs driver-config's
# ``vfio`` entry names to vfio-pci and serves metax-tech.com/vfio-gpu. On GPU nodes
# only (the real metax-vfio-manager's selector: gpu.installed=true), nothing
# required before it, off by default (the CRD defaults vfioManager.deploy to false,
# as the real product's). What it writes on a node goes with it; a node's failure
# message makes it Degraded, and clusteroperator/vfio.py names the nodes without IOMMU.
VFIO_MANAGER = Component(
    name=names.DAEMONSET_VFIO_MANAGER, spec_key="vfioManager", values_key="vfioManager", chart=EXTENSIONS_CHART,
    image="vfio-manager", gpu_nodes_only=True, default_deploy=False,
    cleanup_annotations=(names.ANNOTATION_VFIO_IOMMU, names.ANNOTATION_VFIO_MESSAGE),
    message_annotations=(names.ANNOTATION_VFIO_MESSAGE,),
)

# Chain order: a component comes after every component owning a label it requires.
REGISTRY: Tuple[Component, ...] = (GPU_LABEL, CONTAINER_RUNTIME, DRIVER, MACA, GPU_DEVICE, GPU_AWARE, GPU_EXPORTER,
                                   GPU_DRA, VFIO_MANAGER)

BY_NAME: Dict[str, Component] = {c.name: c for c in REGISTRY}
BY_SPEC_KEY: Dict[str, Component] = {c.spec_key: c for c in REGISTRY}
