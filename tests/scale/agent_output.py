# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What gpu-label and gpu-device publish on a node of each preset, computed by our own code.

A simulated root of each preset is generated once (sim.generator), then read
as the agents read a real node: gpu-label's labels from ``discover`` +
``node_labels``, gpu-device's annotations and ``metax-tech.com/gpu``
capacity from ``DeviceState`` + ``node_annotations`` (the allocator's
per-count tables). Each preset comes in a few allocation states (devices
already taken), so the fleet has nodes with every free count the scheduler
and gpu-aware must tell apart.

This needs the collection on the path (.build/collections): it is the part of
the scale profile that cannot live in the standard-library-only
tests/localcluster package.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Dict, List, Sequence

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.annotations import node_annotations
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.devices import DeviceState
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.gpu.labels import node_labels
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset

from localcluster.fakenodes import GpuProfile

# The local cluster's three presets, as its real nodes have them.
PRESETS = ("8xC500", "4xN100", "2xC550-sriov")
# Devices already allocated, as fractions of the node (0: idle) -- a mixed fleet.
TAKEN = (0.0, 0.0, 0.25, 0.5)


def preset_profiles(name: str, base: str, taken: Sequence[float] = TAKEN) -> List[GpuProfile]:
    host = generator.create(os.path.join(base, name), preset(name))
    labels = node_labels(discover(host, topology=False), "native")
    state = DeviceState(host)
    state.refresh()
    snap = state.snapshot()
    ids = [a.id for a in snap.devices]
    out = []
    for fraction in taken:
        allocated = frozenset(ids[:int(len(ids) * fraction)])
        out.append(GpuProfile(preset=name, labels=dict(labels), annotations=node_annotations(snap, allocated),
                              capacity=len(ids)))
    return out


def profiles(presets: Sequence[str] = PRESETS) -> List[GpuProfile]:
    """Every preset's profiles, interleaved so consecutive nodes differ in preset."""
    base = tempfile.mkdtemp(prefix="metax-scale-sim-")
    try:
        per: Dict[str, List[GpuProfile]] = {name: preset_profiles(name, base) for name in presets}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out: List[GpuProfile] = []
    for i in range(max(len(v) for v in per.values())):
        out.extend(v[i] for v in per.values() if i < len(v))
    return out
