# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The eviction guard as a process of its own: the GPU Extensions chart's Deployment metax-eviction-guard.

    python3 -m ansible_collections.metax.gpu.plugins.module_utils.agents.eviction_webhook \\
        --namespace NS --eviction-webhook-port 9443 --eviction-webhook-tls-dir /etc/metax/eviction-webhook

An admission webhook that admits driver-manager's evictions of its own node's
pods only (``eviction_webhook.py`` has the decision and the server; the
operator-controller serves the same in the GPU Operator scheme). Reads pods by
name (RBAC: pods get); never runs on the node whose requests it judges.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from .. import eviction_webhook, names
from ..kube.client import core_v1
from .common import UsageError, add_common_flags, kube_api_client, run_main, setup_logging, stop_event

COMPONENT = "eviction-guard"
DEFAULT_PORT = 9443


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMPONENT, description=__doc__.split("\n\n", maxsplit=1)[0])
    add_common_flags(parser, host_root=False)
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", names.OPERATOR_NAMESPACE),
                        help="the namespace of the guarded service accounts (driver-manager's)")
    eviction_webhook.add_flags(parser, default_port=DEFAULT_PORT)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    if not 0 < args.eviction_webhook_port < 65536:
        raise UsageError("--eviction-webhook-port must be 1-65535, not %d" % args.eviction_webhook_port)
    try:
        server = eviction_webhook.serve_from_flags(core_v1(kube_api_client(args.kubeconfig)), args)
    except (OSError, ValueError) as exc:      # ssl.SSLError is an OSError: a missing or bad certificate
        raise UsageError("cannot serve on :%d with the certificate in %s: %s"
                         % (args.eviction_webhook_port, args.eviction_webhook_tls_dir, exc))
    stop_event().wait()
    server.stop()
    return 0


if __name__ == "__main__":
    run_main(COMPONENT, lambda: main(sys.argv[1:]))
