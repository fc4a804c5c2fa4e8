# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""grpc and the kubelet API stubs, imported once under the ImportError guard.

grpcio and protobuf are the agents' requirements (requirements/agents.txt),
not a controller's: a module importing module_utils must load without them.
``HAS_GRPC`` says whether they are there; when not, every name is None.
"""

from __future__ import annotations

try:
    import grpc
    from ..deviceplugin.api import deviceplugin_v1beta1_pb2 as dp_pb
    from ..deviceplugin.api import deviceplugin_v1beta1_pb2_grpc as dp_grpc
    from ..deviceplugin.api import podresources_v1_pb2 as pr_pb
    from ..deviceplugin.api import podresources_v1_pb2_grpc as pr_grpc
    from ..deviceplugin.api import dra_v1_pb2 as dra_pb
    from ..deviceplugin.api import dra_v1_pb2_grpc as dra_grpc
    from ..deviceplugin.api import dra_health_v1alpha1_pb2 as drahealth_pb
    from ..deviceplugin.api import dra_health_v1alpha1_pb2_grpc as drahealth_grpc
    from ..deviceplugin.api import pluginregistration_v1_pb2 as reg_pb
    from ..deviceplugin.api import pluginregistration_v1_pb2_grpc as reg_grpc
    HAS_GRPC = True
except ImportError:
    grpc = dp_pb = dp_grpc = pr_pb = pr_grpc = None
    dra_pb = dra_grpc = reg_pb = reg_grpc = None
    drahealth_pb = drahealth_grpc = None
    HAS_GRPC = False

REQUIRED = "grpcio and protobuf are required (requirements/agents.txt)"
# what the agents import from here (the reason this module exists)
__all__ = ("HAS_GRPC", "REQUIRED", "dp_grpc", "dp_pb", "grpc", "pr_grpc", "pr_pb",
           "dra_grpc", "dra_pb", "reg_grpc", "reg_pb", "drahealth_grpc", "drahealth_pb")
