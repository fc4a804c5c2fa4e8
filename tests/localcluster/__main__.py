# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""python3 -m localcluster plan | inventory NODES_JSON ADMIN_CONF | compare
(PYTHONPATH=<repo>/tests; standard library only: cluster.sh runs it before the venv exists)

plan       the node table `up` makes of NODES, as `cluster.sh plan` prints it
           (NODES, METAX_NODE_NAME, METAX_CLUSTER_DIR, METAX_SIM_PRESET from the environment)
inventory  the Ansible inventory of the cluster NODES_JSON describes (`cluster.sh inventory`)
compare    regenerate every config file of the running cluster and compare it
           with the file cluster.sh wrote (read-only); exit 1 on a difference
"""

from __future__ import annotations

import json
import os
import sys

from . import edge, envfile, nodes
from .settings import from_env


def main(argv: list[str]) -> int:
    settings = from_env(os.environ)
    if argv[1:] == ["plan"]:
        try:
            sys.stdout.write(nodes.render_table(edge.planned_nodes(settings, os.environ)))
        except nodes.PlanError as exc:
            sys.stderr.write("ERROR: %s\n" % exc)
            return 1
        return 0
    if len(argv) == 4 and argv[1] == "inventory":
        with open(argv[2], encoding="utf-8") as fh:
            sys.stdout.write(envfile.inventory(json.load(fh), argv[3]))
        return 0
    if argv[1:] == ["compare"]:
        from . import equivalence  # openssl, iptables, ip: only for this command

        results = equivalence.compare_running(settings)
        for r in results:
            sys.stdout.write("%-10s %s%s\n" % (r.verdict, r.path, " (%s)" % r.detail if r.detail else ""))
        return 0 if all(r.ok for r in results) else 1
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
