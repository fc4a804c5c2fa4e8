# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Generated protobuf/gRPC stubs of the kubelet APIs (see ../gen_protos.sh).

The ``*_pb2.py`` and ``*_pb2_grpc.py`` files are generated and committed;
import them only where grpcio and protobuf are installed (the agents).
"""
