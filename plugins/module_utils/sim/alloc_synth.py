# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Synthetic topologies for the allocator's tests, benchmarks and CLI presets.

Built straight from simulator specs (:func:`~.spec.expected_link`) or
drawn at random, without a host root. Device numbering under SR-IOV here is
``gpu * vfs + vf``; real nodes get their numbering from discovery.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Dict, List, Optional, Sequence, Tuple

from ..gpu.model import LinkClass, Topology, build_topology
from .spec import GpuSpec, NodeSpec, expected_link


def expand_vfs(gpu_links: Dict[Tuple[int, int], LinkClass], gpus: int, vfs: int) -> Topology:
    """Topology of ``gpus * vfs`` VF devices over a GPU-level pair map (``vfs == 0``: the GPUs)."""
    if vfs <= 0:
        return build_topology(range(gpus), lambda a, b: gpu_links[(a, b)])

    def link(a: int, b: int) -> LinkClass:
        ga, gb = a // vfs, b // vfs
        if ga == gb:
            return LinkClass.SAME_GPU
        return gpu_links[(min(ga, gb), max(ga, gb))]

    return build_topology(range(gpus * vfs), link)


def spec_links(spec: NodeSpec) -> Dict[Tuple[int, int], LinkClass]:
    gpus = spec.gpus
    return {(a, b): expected_link(gpus[a], gpus[b]) for a in range(len(gpus)) for b in range(a + 1, len(gpus))}


def pcie_links(spec: NodeSpec) -> Dict[Tuple[int, int], LinkClass]:
    """The PCIe class of every pair, ignoring MetaXLink (for peers that count both)."""
    plain = [dataclasses.replace(g, metaxlink_group=None) for g in spec.gpus]
    return {(a, b): expected_link(plain[a], plain[b]) for a in range(len(plain)) for b in range(a + 1, len(plain))}


def topology_from_spec(spec: NodeSpec, vfs: int = 0) -> Topology:
    return expand_vfs(spec_links(spec), len(spec.gpus), vfs)


def random_spec(rng: random.Random, gpus: int, aligned: bool = True, product: str = "C500") -> NodeSpec:
    """A plausible random node: NUMA nodes, root complexes, ports, switch trees, MetaXLink groups.

    ``aligned`` MetaXLink groups are a subset of one switch or whole switches
    under one root port (what boards look like, and ultrametric); otherwise
    groups are random sets of GPUs.
    """
    specs: List[GpuSpec] = []
    switch_ids = iter(range(10 ** 6))
    port_ids = iter(range(10 ** 6))
    ports: List[List[int]] = []      # GPU positions per root port, per switch
    switches: List[List[int]] = []
    switch_port: List[int] = []
    while len(specs) < gpus:
        numa = rng.randint(0, 1)
        rc = numa * 2 + rng.randint(0, 1)
        port = next(port_ids)
        ports.append([])
        if rng.random() < 0.2:
            ports[-1].append(len(specs))
            specs.append(GpuSpec(product, numa_node=numa, root_complex=rc, root_port=port))
            continue
        top = next(switch_ids)
        paths: List[Tuple[int, ...]] = [(top,)]
        for _extra in range(rng.randint(0, 2)):
            paths.append((top, next(switch_ids)))
        for path in paths:
            count = min(rng.randint(1, 4), gpus - len(specs))
            if count <= 0:
                break
            switches.append([])
            switch_port.append(len(ports) - 1)
            for _slot in range(count):
                switches[-1].append(len(specs))
                ports[-1].append(len(specs))
                specs.append(GpuSpec(product, numa_node=numa, root_complex=rc, root_port=port,
                                     switch_path=path))
    groups: Dict[int, int] = {}
    next_group = iter(range(10 ** 6))
    if aligned:
        used = set()
        for sw, members in enumerate(switches):
            if sw in used or rng.random() < 0.4:
                continue
            siblings = [o for o in range(len(switches)) if switch_port[o] == switch_port[sw] and o != sw and o not in used]
            if siblings and rng.random() < 0.3:
                other = rng.choice(siblings)
                used.add(other)
                chosen = members + switches[other]
            else:
                chosen = members[:rng.randint(2, len(members))] if len(members) >= 2 else []
            used.add(sw)
            if len(chosen) >= 2:
                gid = next(next_group)
                for pos in chosen:
                    groups[pos] = gid
    else:
        order = list(range(len(specs)))
        rng.shuffle(order)
        while len(order) >= 2 and rng.random() < 0.8:
            take = rng.randint(2, min(6, len(order)))
            gid = next(next_group)
            for pos in order[:take]:
                groups[pos] = gid
            order = order[take:]
    specs = [dataclasses.replace(g, metaxlink_group=groups.get(i)) for i, g in enumerate(specs)]
    spec = NodeSpec("random-%d" % gpus, tuple(specs))
    spec.validate()
    return spec


def random_ultrametric(rng: random.Random, devices: int, min_class: int = 0) -> Topology:
    """A random hierarchy of link classes over ``devices`` devices (always ultrametric)."""
    links: Dict[Tuple[int, int], LinkClass] = {}

    def split(members: Sequence[int], lowest: int) -> None:
        if len(members) < 2:
            return
        cls = rng.randint(lowest, int(LinkClass.SAME_GPU))
        if cls == int(LinkClass.SAME_GPU):
            parts: List[List[int]] = [[m] for m in members]
        else:
            count = rng.randint(2, min(4, len(members)))
            parts = [[] for _part in range(count)]
            for i, m in enumerate(members):
                parts[i if i < count else rng.randrange(count)].append(m)
        for i, part in enumerate(parts):
            for other in parts[i + 1:]:
                for a in part:
                    for b in other:
                        links[(min(a, b), max(a, b))] = LinkClass(cls)
            split(part, cls + 1)

    order = list(range(devices))
    rng.shuffle(order)
    split(order, min_class)
    return build_topology(range(devices), lambda a, b: links[(a, b)])


def random_matrix(rng: random.Random, devices: int, classes: Optional[Sequence[LinkClass]] = None) -> Topology:
    """Independent random class per pair (rarely ultrametric: exercises the fallback)."""
    pool = list(classes) if classes else list(LinkClass)
    return build_topology(range(devices), lambda a, b: rng.choice(pool))
