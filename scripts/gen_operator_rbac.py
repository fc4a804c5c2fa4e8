# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""docs/operator-rbac.md from a live API server: `kubectl auth can-i --list` per service account.

The GPU Operator scheme's service accounts (the controller's and the agents'
the controller applies) get their rights from two charts. What they may really
do is what the API server answers, so the committed table is that answer:

    python3 scripts/gen_operator_rbac.py [--kubeconfig F] [--kubectl kubectl]           # rewrite the table
    python3 scripts/gen_operator_rbac.py [--kubeconfig F] [--kubectl kubectl] --check   # exit 1 on a difference

Run it with the metax-operator chart installed and gpu-aware deployed
(`spec.gpuAware.deploy: true`), so that every account exists. Both modes also
fail on a wildcard verb or resource and on any right on Secrets (least
privilege, issue 24). The integration tests (private API server and the local
cluster) call :func:`check` with their own kubectl.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Callable, List, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "operator-rbac.md")
NAMESPACE = "metax-operator"
# the optional components the table shows are deployed while it is read (OPTIONAL_COMPONENTS)
SERVICE_ACCOUNTS = ("operator-controller", "gpu-label", "gpu-device", "gpu-aware", "gpu-dra", "vfio-manager")
# spec sections switched on while the table is read, and the ClusterRoleBinding each brings
OPTIONAL_COMPONENTS = {"gpuAware": "metax-gpu-gpu-aware", "draDriver": "metax-gpu-gpu-dra",
                       "vfioManager": "metax-gpu-vfio-manager"}
MARKER = "<!-- generated: kubectl auth can-i --list, scripts/gen_operator_rbac.py -->"
# granted to every authenticated user by the API server's defaults, not by us
DEFAULT_RULES = ("selfsubjectreviews.authentication.k8s.io", "selfsubjectaccessreviews.authorization.k8s.io",
                 "selfsubjectrulesreviews.authorization.k8s.io")

Row = Tuple[str, str, str]
Kubectl = Callable[[Sequence[str]], str]   # kubectl ARGS -> stdout (raises on failure)


def parse_can_i(output: str) -> List[Row]:
    """(resource, resource names, verbs) rows of `kubectl auth can-i --list`, the defaults left out."""
    rows = []
    for line in output.splitlines()[1:]:
        fields = re.findall(r"\[[^]]*\]|\S+", line)
        if len(fields) != 4 or fields[0] in DEFAULT_RULES:
            continue  # non-resource URLs (discovery, health) have no resource column
        rows.append((fields[0], fields[2], fields[3]))
    return sorted(rows)


def table(kubectl: Kubectl, namespace: str = NAMESPACE) -> str:
    lines = []
    for account in SERVICE_ACCOUNTS:
        out = kubectl(["auth", "can-i", "--list", "-n", namespace,
                       "--as=system:serviceaccount:%s:%s" % (namespace, account)])
        lines += ["", "### %s" % account, "", "| resource | resource names | verbs |", "|---|---|---|"]
        lines += ["| %s | %s | %s |" % row for row in parse_can_i(out)]
    return "\n".join(lines) + "\n"


def violations(text: str) -> List[str]:
    """Rows granting a wildcard or anything on Secrets."""
    return [line for line in text.splitlines() if line.startswith("|") and ("*" in line or "secrets" in line)]


def split_doc(doc: str) -> Tuple[str, str]:
    head = doc[:doc.index(MARKER) + len(MARKER)]
    return head, doc[len(head):]


def check(kubectl: Kubectl, namespace: str = NAMESPACE, path: str = DOC) -> Tuple[str, List[str]]:
    """The live table and what is wrong with it (empty: it is the committed table, least privilege)."""
    live = table(kubectl, namespace)
    problems = ["wildcard or Secrets: " + line for line in violations(live)]
    with open(path) as fh:
        _head, committed = split_doc(fh.read())
    if committed != "\n" + live:
        problems.append("the live rights differ from %s" % os.path.relpath(path, ROOT))
    return live, problems


def write(live: str, path: str = DOC) -> None:
    with open(path) as fh:
        head, _old = split_doc(fh.read())
    with open(path, "w") as fh:
        fh.write(head + "\n" + live)


def kubectl_runner(kubectl: str, kubeconfig: str = "") -> Kubectl:
    def run(args: Sequence[str]) -> str:
        cmd = [kubectl] + (["--kubeconfig", kubeconfig] if kubeconfig else []) + list(args)
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60,
                              stdin=subprocess.DEVNULL).stdout
    return run


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""))
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--namespace", default=NAMESPACE)
    parser.add_argument("--check", action="store_true", help="exit 1 when the live rights differ from the doc")
    args = parser.parse_args(list(argv))
    live, problems = check(kubectl_runner(args.kubectl, args.kubeconfig), args.namespace)
    bad = violations(live)
    if bad:
        print("least privilege broken (wildcard or Secrets):\n" + "\n".join(bad), file=sys.stderr)
        return 1
    if args.check:
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print(live, file=sys.stderr)
        return 1 if problems else 0
    write(live)
    print("wrote %s" % os.path.relpath(DOC, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
