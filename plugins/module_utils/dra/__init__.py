# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-dra, the Dynamic Resource Allocation driver ``gpu.metax-tech.com`` (docs/dra.md).

``slices``      the node's devices as ResourceSlices (pure): attributes, capacity, taints,
                the pool's generation, what to create/update/delete
``prepare``     NodePrepareResources / NodeUnprepareResources: a checkpointed, idempotent
                claim -> CDI spec bookkeeping (files only; the claim read is injected)
``server``      the DRA node service over gRPC (kubelet/grpc_api's stubs)
``publish``     the ResourceSlices written through the API server (kube/client)

Standard library only below ``server`` and ``publish``: this runs on nodes.
"""
