# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""python3 -m localcluster COMMAND: the local cluster's commands (scripts/cluster/cluster.sh runs this).

up       idempotent; builds/installs what is missing first (scripts/deps.sh); NODES: one preset per node
down     stops only what `up` started (PID files), unmounts, removes what it added; always safe to run
status   components, kubeconfig, registries, nodes; exit 0 up, 1 partial, 3 down
env      shell exports for using the cluster: eval "$(cluster.sh env)"
json     the same as JSON with the node list (tests/integration/conftest.py)
inventory  an Ansible YAML inventory of the running cluster
restart-kubelet [NODE]  restart one node's kubelet (default: the first node)
podman-env  CONTAINERS_CONF/CONTAINERS_REGISTRIES_CONF exports (no cluster needed)
plan     the node table `up` makes of NODES: "INDEX NAME PRESET" per line (no cluster needed)
compare  regenerate every config file of the running cluster and compare it with what runs (read-only)

PYTHONPATH=<repo>/tests; standard library only: it runs with the machine's python3 before the venv exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from typing import Iterator

from . import commands
from .output import ClusterError, error, log
from .runtime import Runtime, from_environ

USAGE = "usage: cluster.sh up|down|status|restart-kubelet [NODE]|env|json|inventory|podman-env|plan\n"


@contextlib.contextmanager
def cluster_lock(rt: Runtime) -> Iterator[None]:
    """One up/down/restart-kubelet at a time (<cache>/cluster.lock; `compare` holds it shared). The
    daemons never inherit it: LocalHost.start closes every other descriptor."""
    if rt.env.get("METAX_CLUSTER_LOCK_HELD"):
        yield
        return
    os.makedirs(rt.settings.cache_dir, exist_ok=True)
    with open(rt.settings.cache_dir + "/cluster.lock", "w", encoding="ascii") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            log("another cluster.sh up/down is running; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def run(argv: list[str]) -> int:
    rt = from_environ(os.environ)
    cmd, args = (argv[1] if len(argv) > 1 else ""), argv[2:]
    if cmd in ("up", "down", "restart-kubelet"):
        from . import teardown, up  # pylint: disable=import-outside-toplevel

        with cluster_lock(rt):
            if cmd == "up":
                return up.up(rt, rt.env.get("NODES", ""))
            if cmd == "down":
                up.require_root()
                teardown.down(rt)
                return 0
            return commands.restart_kubelet_command(rt, args[0] if args else "")
    simple = {"status": commands.status_command, "env": commands.env_command, "json": commands.json_command,
              "inventory": commands.inventory_command, "plan": commands.plan_command,
              "podman-env": commands.podman_env_command}
    if cmd in simple and not args:
        return simple[cmd](rt)
    if cmd == "inventory" and len(args) == 2:
        # the older two-argument form: a nodes.json and the admin kubeconfig
        import json  # pylint: disable=import-outside-toplevel

        from . import envfile  # pylint: disable=import-outside-toplevel

        with open(args[0], encoding="utf-8") as fh:
            sys.stdout.write(envfile.inventory(json.load(fh), args[1]))
        return 0
    if cmd == "compare":
        from . import equivalence  # pylint: disable=import-outside-toplevel  # openssl, iptables, ip

        results = equivalence.compare_running(rt.settings)
        for r in results:
            sys.stdout.write("%-10s %s%s\n" % (r.verdict, r.path, " (%s)" % r.detail if r.detail else ""))
        return 0 if all(r.ok for r in results) else 1
    sys.stderr.write(USAGE)
    return 2


def main(argv: list[str]) -> int:
    try:
        return run(argv)
    except ClusterError as exc:
        error(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
