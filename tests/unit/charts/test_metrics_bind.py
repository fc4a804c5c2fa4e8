# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The /metrics servers bind 0.0.0.0 of their pod's own network namespace (docs/security.md, threat model).

That is the pod IP and loopback only while the pods are not on the host
network; a chart that put them there would have to bind the pod IP instead.
"""
from __future__ import annotations

from ansible_collections.metax.gpu.plugins.module_utils import names

from .helm import find_helm, helm_required, render

HELM = find_helm()


@helm_required(HELM)
def test_the_metrics_servers_run_in_their_own_network_namespace():
    rc, objects, err = render(HELM, {"gpuExporter": {"enabled": True}})
    assert rc == 0, err
    pods = {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects if o["kind"] == "DaemonSet"}
    serving = [name for name, spec in pods.items()
               if any(p.get("name") == "metrics" for c in spec["containers"] for p in c.get("ports") or [])]
    assert sorted(serving) == sorted([names.DAEMONSET_GPU_DEVICE, names.DAEMONSET_GPU_EXPORTER])
    for name in serving:
        spec = pods[name]
        assert not spec.get("hostNetwork"), name
        args = [a for c in spec["containers"] for a in c.get("args") or []]
        assert not any(a.startswith(("--address=", "--metrics-address=")) for a in args), (name, args)
