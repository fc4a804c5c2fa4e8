# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The simulated node's PCI layout: the GPUs in canonical order, their bus numbers
(depth first, as firmware assigns them) and VF addresses. Pure: no files."""

from __future__ import annotations

from typing import List, Tuple

from ..errors import MetaxGpuError
from .spec import GpuSpec, NodeSpec


class SimError(MetaxGpuError):
    """A simulated-node operation was invalid (unknown GPU, bad directory...)."""


def canonical_gpus(spec: NodeSpec) -> List[GpuSpec]:
    """GPUs in PCI address order: the order discovery and mx-smi index them.

    Sorting by placement makes every subtree contiguous, so the depth-first
    bus numbering below yields increasing addresses in exactly this order.
    """
    order = sorted(range(len(spec.gpus)),
                   key=lambda i: (spec.gpus[i].root_complex, spec.gpus[i].root_port,
                                  spec.gpus[i].switch_path, i))
    return [spec.gpus[i] for i in order]


def vf_bdf(pf_bdf: str, k: int) -> str:
    """BDF of VF number ``k`` (1-based) of a PF at function 0."""
    domain, bus = pf_bdf.split(":")[:2]
    return "%s:%s:%02x.%d" % (domain, bus, k >> 3, k & 7)


def _bdf(domain: int, bus: int, dev: int, fn: int = 0) -> str:
    return "%04x:%02x:%02x.%d" % (domain, bus, dev, fn)


class _Layout:
    """Assigns bus numbers depth-first and records each GPU's sysfs path."""

    def __init__(self, gpus: List[GpuSpec]) -> None:
        self.gpus = gpus
        self.bridges: List[Tuple[str, str]] = []   # (sysfs dir, bdf)
        self.gpu_dirs: List[str] = [""] * len(gpus)

    def build(self) -> None:
        complexes = sorted({g.root_complex for g in self.gpus})
        for rc in complexes:
            domain, base = rc // 4, (rc % 4) * 0x40
            rc_dir = "sys/devices/pci%04x:%02x" % (domain, base)
            next_bus = [base + 1]
            members = [i for i, g in enumerate(self.gpus) if g.root_complex == rc]
            ports = sorted({self.gpus[i].root_port for i in members})
            for port in ports:
                port_bdf = _bdf(domain, base, port + 1)
                port_dir = "%s/%s" % (rc_dir, port_bdf)
                self.bridges.append((port_dir, port_bdf))
                under = [i for i in members if self.gpus[i].root_port == port]
                self._subtree(port_dir, under, 0, domain, next_bus, base)

    def _subtree(self, parent_dir: str, members: List[int], depth: int, domain: int,
                 next_bus: List[int], base: int) -> None:
        # children in first-appearance order: a GPU ending here, or a switch one level down
        children: List[Tuple[str, object]] = []
        seen = set()
        for i in members:
            path = self.gpus[i].switch_path
            if len(path) == depth:
                children.append(("gpu", i))
            elif path[depth] not in seen:
                seen.add(path[depth])
                children.append(("switch", path[depth]))
        if depth > 0:
            # inside a switch: the upstream port sits on its own bus, downstream ports on the next
            up_bus = self._take_bus(next_bus, base)
            up_bdf = _bdf(domain, up_bus, 0)
            up_dir = "%s/%s" % (parent_dir, up_bdf)
            self.bridges.append((up_dir, up_bdf))
            down_bus = self._take_bus(next_bus, base)
            for slot, child in enumerate(children):
                down_bdf = _bdf(domain, down_bus, slot)
                down_dir = "%s/%s" % (up_dir, down_bdf)
                self.bridges.append((down_dir, down_bdf))
                self._place(down_dir, child, members, depth, domain, next_bus, base)
        else:
            if len(children) != 1 and any(child[0] == "gpu" for child in children):
                raise SimError("a GPU attached directly to a root port must be alone there")
            for child in children:
                self._place(parent_dir, child, members, depth, domain, next_bus, base)

    def _place(self, parent_dir, child, members, depth, domain, next_bus, base) -> None:
        kind, value = child
        if kind == "gpu":
            bus = self._take_bus(next_bus, base)
            self.gpu_dirs[value] = "%s/%s" % (parent_dir, _bdf(domain, bus, 0))
        else:
            sub = [i for i in members if len(self.gpus[i].switch_path) > depth
                   and self.gpus[i].switch_path[depth] == value]
            self._subtree(parent_dir, sub, depth + 1, domain, next_bus, base)

    @staticmethod
    def _take_bus(next_bus: List[int], base: int) -> int:
        bus = next_bus[0]
        if bus >= base + 0x40:
            raise SimError("too many buses under one root complex in this spec")
        next_bus[0] += 1
        return bus
