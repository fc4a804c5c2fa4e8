# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A free TCP port on 127.0.0.1, for the real servers the tests start
(registries, Prometheus, API servers, agents). ``tests/`` is on sys.path
through the top conftest, so every test module imports it as ``ports``."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
