# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The scheme check's cost per playbook run: the role as it is against its former reads, in one run.

    flock -o /tmp/metax-heavy.lock env PYTHONPATH=.build/collections \\
        .venv/bin/python benchmarks/scheme_check_bench.py [--runs 8]

Every install, site and uninstall run starts with the ``metax.gpu.scheme_check``
role. On a private control plane (etcd and kube-apiserver, never the shared
cluster) holding the ClusterOperator CRD, one ClusterOperator and the device
plugin's DaemonSet, one playbook runs the check ``--runs`` times in each of
two ways, alternating:

- baseline: the role's tasks before session 21 (benchmarks/scheme_check_baseline.yml):
  ``helm list``, two ``kubernetes.core.k8s_info`` reads (ClusterOperator
  objects, DaemonSets of every namespace), the filters in a ``set_fact``;
- now: the role (``helm list`` and one ``metax.gpu.installed_scheme`` run).

Both must find the same thing. The timeline callback
(benchmarks/callback_plugins/metax_timeline.py) gives each run's seconds.
Prints the median of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

import scale_common  # noqa: F401  # pylint: disable=unused-import  # first: the collection and tests/ on sys.path

from controlplane import ControlPlane, lib_dir  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils import names as N  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BASELINE = os.path.join(HERE, "scheme_check_baseline.yml")

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  vars:
    scheme_check_wanted: operator
    scheme_check_kubeconfig: {kubeconfig}
    scheme_check_helm_binary: {helm}
    scheme_check_refuse: false
  tasks:
    - name: Start
      ansible.builtin.ping:
    - name: Both ways, alternating
      ansible.builtin.include_tasks: {steps}
      loop: "{{{{ range({runs}) | list }}}}"
      loop_control:
        loop_var: bench_round
"""

STEPS = """
- name: mark baseline
  ansible.builtin.debug:
    msg: baseline
- name: The former reads
  ansible.builtin.include_tasks: {baseline}
- name: Keep what the baseline found
  ansible.builtin.set_fact:
    bench_baseline_found: "{{{{ scheme_check_found }}}}"
- name: mark now
  ansible.builtin.debug:
    msg: now
- name: The role
  ansible.builtin.include_role:
    name: metax.gpu.scheme_check
- name: mark done
  ansible.builtin.assert:
    that: scheme_check_found == bench_baseline_found and scheme_check_found.operator | length > 0
"""


def seed(plane: ControlPlane) -> None:
    crd = os.path.join(REPO, "files", "charts", "metax-operator", "crds", "clusteroperator.yaml")
    for args in (("apply", "-f", crd),
                 ("wait", "--for=condition=Established", "--timeout=60s",
                  "crd/%s.%s" % (N.OPERATOR_PLURAL, N.OPERATOR_GROUP)),
                 ("create", "namespace", N.OPERATOR_NAMESPACE)):
        res = plane.kubectl(*args)
        if res.returncode != 0:
            sys.exit("kubectl %s: %s" % (" ".join(args), res.stderr))
    objects = [
        {"apiVersion": "%s/%s" % (N.OPERATOR_GROUP, N.OPERATOR_VERSION), "kind": N.OPERATOR_KIND,
         "metadata": {"name": N.OPERATOR_CR_NAME}, "spec": {}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet",
         "metadata": {"name": N.DAEMONSET_GPU_DEVICE, "namespace": N.OPERATOR_NAMESPACE,
                      "labels": {N.LABEL_OPERATOR_OWNER: N.OPERATOR_CR_NAME}},
         "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {
             "metadata": {"labels": {"app": "d"}},
             "spec": {"containers": [{"name": "c", "image": "registry.invalid/gpu-device:1"}]}}}},
    ]
    res = plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    if res.returncode != 0:
        sys.exit("seeding the control plane: %s" % res.stderr)


def run(plane: ControlPlane, runs: int, work: str) -> Dict[str, List[float]]:
    helm = os.path.join(lib_dir("helm_bin_dir"), "helm")     # the pinned helm the deps phase builds
    steps = os.path.join(work, "steps.yml")
    with open(steps, "w") as handle:
        handle.write(STEPS.format(baseline=BASELINE))
    playbook = os.path.join(work, "bench.yml")
    with open(playbook, "w") as handle:
        handle.write(PLAYBOOK.format(kubeconfig=plane.kubeconfig, helm=helm, steps=steps, runs=runs))
    timeline = os.path.join(work, "timeline.jsonl")
    env = dict(os.environ, METAX_TIMELINE=timeline, ANSIBLE_CALLBACK_PLUGINS=os.path.join(HERE, "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="metax_timeline",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable, playbook],
                          capture_output=True, text=True, env=env, timeout=1800, check=False)
    if proc.returncode != 0:
        sys.exit("the benchmark playbook failed:\n%s\n%s" % (proc.stdout[-4000:], proc.stderr[-2000:]))
    with open(timeline) as handle:
        tasks = [e for e in (json.loads(line) for line in handle) if e["ev"] == "task"]
    # by order, not by name: each round is mark baseline, the former reads, Keep..., mark now, the role, mark done
    starts = [e["t"] for e in tasks if e["name"].startswith(("mark ", "Keep what the baseline found"))]
    rounds = [starts[i:i + 4] for i in range(0, len(starts), 4)]
    if len(rounds) != runs or any(len(r) != 4 for r in rounds):
        sys.exit("unexpected timeline: %d marks for %d runs" % (len(starts), runs))
    return {"baseline": [r[1] - r[0] for r in rounds], "now": [r[3] - r[2] for r in rounds]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    plane = ControlPlane().start()
    try:
        seed(plane)
        with tempfile.TemporaryDirectory(prefix="metax-scheme-bench-") as work:
            times = run(plane, args.runs, work)
    finally:
        plane.stop()
    base, now = statistics.median(times["baseline"]), statistics.median(times["now"])
    print("scheme check per playbook run, median of %d (the same playbook, alternating):" % args.runs)
    print("  baseline (helm list + 2 x k8s_info + set_fact)   %.2f s" % base)
    print("  now      (helm list + metax.gpu.installed_scheme) %.2f s" % now)
    print("  ratio now/baseline                              %.2f" % (now / base))


if __name__ == "__main__":
    main()
