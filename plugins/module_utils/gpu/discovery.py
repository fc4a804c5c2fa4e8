# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Discover a node's MetaX GPUs: PCI scan + mx-smi -> one :class:`Inventory`.

PCI gives presence, placement (NUMA, switch, host bridge), SR-IOV and the
DRM nodes; ``mx-smi`` adds MetaXLink, health and UUIDs. Without ``mx-smi``
(or with the driver unloaded) discovery still answers from PCI and marks
MetaXLink as unknown.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Tuple

from ..errors import MetaxGpuError
from ..host import HostRoot, HostRootError
from . import mxsmi, pci
from . import model
from .model import (
    Device, DriverState, Gpu, Inventory, LinkClass, LinkGroup, SriovState, build_topology, pair_key,
)

DRIVER_MODULE = "sys/module/metax"
MX_SMI = "mx-smi"


class DiscoveryError(MetaxGpuError):
    """Discovery failed; the message names the file or command and the line."""


def read_driver(host: HostRoot) -> DriverState:
    if not host.isdir(DRIVER_MODULE):
        return DriverState(loaded=False)
    version = host.read_attribute(DRIVER_MODULE + "/version", default="") or None
    return DriverState(loaded=True, version=version)


class _MxSmiView:
    """What mx-smi said, keyed by PCI address."""

    def __init__(self) -> None:
        self.available = False
        self.complete = True     # every GPU record of the table was understood
        self.by_bdf: Dict[str, mxsmi.MxSmiGpu] = {}
        self.ids: Dict[str, Dict[str, str]] = {}
        self.links: Optional[Dict[Tuple[str, str], LinkClass]] = None
        self.maca_version: Optional[str] = None
        self.driver_version: Optional[str] = None
        self.unparsed: List[str] = []   # warnings about output not understood


class KnownIds:
    """What ``mx-smi -L`` said (names, UUIDs, serials), kept for the next scans of an agent that reads
    the node every few seconds (gpu-device, gpu-dra). One thread uses it (the agent's reading loop).

    Kept only when ``-L`` named every GPU of the table with a UUID and nothing in it was not understood;
    run again when the table lists other GPUs, another state of one or another driver, and at least
    every ``max_age`` seconds: a UUID belongs to the board at a PCI address. One ``mx-smi`` run fewer
    per reading (of two to four), on every node.
    """

    def __init__(self, max_age: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age = max_age
        self.clock = clock
        self._key: Optional[tuple] = None
        self._until = 0.0
        self.ids: Dict[str, Dict[str, str]] = {}
        self.problems: List[str] = []
        self.runs = 0            # how often -L was run (the tests read it)

    @staticmethod
    def key(table: mxsmi.MxSmiTable) -> tuple:
        return (table.driver_version, tuple((g.index, g.bdf, g.name, g.state) for g in table.gpus))

    def get(self, key: tuple) -> Optional[Tuple[Dict[str, Dict[str, str]], List[str]]]:
        if key != self._key or self.clock() >= self._until:
            return None
        return self.ids, self.problems

    def keep(self, key: tuple, ids: Dict[str, Dict[str, str]], problems: List[str]) -> None:
        self._key, self._until, self.ids, self.problems = key, self.clock() + self.max_age, ids, problems


def _run(host: HostRoot, binary: str, args: List[str], warnings: List[str]) -> Optional[str]:
    try:
        rc, out, err = host.run([binary] + args)
    except (HostRootError, OSError) as exc:
        # an mx-smi that cannot run at all (wrong architecture after a driver
        # update, hung, not executable) degrades like one that fails
        warnings.append("`mx-smi %s` could not be run (%s): GPUs from PCI/sysfs only"
                        % (" ".join(args), exc))
        return None
    if rc != 0:
        detail = (err.strip() or out.strip() or "no output").splitlines()[0][:200]
        warnings.append("`mx-smi %s` exited %d: %s" % (" ".join(args), rc, detail))
        return None
    return out


def _not_understood(view: _MxSmiView, warnings: List[str], binary: str, message: str, fallback: str) -> None:
    text = "%s: %s; %s" % (binary, message, fallback)
    view.unparsed.append(text)
    warnings.append(text)


# A parser bug must not take an agent off the node any more than odd output:
# everything a parser raises becomes a warning and discovery answers from PCI.
_PARSE_FAILURES = (mxsmi.MxSmiParseError, ValueError, IndexError, KeyError, TypeError, AttributeError)


def _list(host: HostRoot, binary: str, table: mxsmi.MxSmiTable, warnings: List[str],
          known: Optional[KnownIds]) -> Optional[Tuple[Dict[str, Dict[str, str]], List[str]]]:
    """``mx-smi -L`` by PCI address, and what of it was not understood; None when it did not run."""
    key = KnownIds.key(table)
    kept = known.get(key) if known is not None else None
    if kept is not None:
        return kept
    list_out = _run(host, binary, ["-L"], warnings)
    if list_out is None:
        return None
    problems: List[str] = []
    try:
        listed = mxsmi.parse_list(list_out, problems)
    except _PARSE_FAILURES as exc:
        problems, listed = [str(exc)], {}
    # -L names each GPU's PCI address: keyed by it, not by its index
    ids = {f["bdf"]: f for f in listed.values()}
    if known is not None:
        known.runs += 1
        # a GPU without a UUID (not ready yet, not available) or a line not understood: ask again next time
        if not problems and all((ids.get(g.bdf) or {}).get("uuid") for g in table.gpus):
            known.keep(key, ids, problems)
    return ids, problems


def query_mx_smi(host: HostRoot, warnings: List[str], topology: bool = True,
                 known: Optional[KnownIds] = None) -> _MxSmiView:
    """Run mx-smi; whatever it prints that is not understood becomes a warning, never an error.

    ``known``: the ``-L`` answer of an earlier scan, reused while the table lists the same GPUs."""
    view = _MxSmiView()
    binary = host.which(MX_SMI)
    if binary is None:
        warnings.append("mx-smi not found under %s: health and MetaXLink are unknown" % host.path)
        return view
    table_out = _run(host, binary, [], warnings)
    if table_out is None:
        return view
    try:
        table = mxsmi.parse_table(table_out)
    except _PARSE_FAILURES as exc:
        _not_understood(view, warnings, binary, str(exc),
                        "GPUs from PCI/sysfs only (health, UUIDs and MetaXLink unknown)")
        return view
    if not table.gpus:
        # called only when PCI shows MetaX GPUs: a table without any is a
        # layout we did not follow, not proof that every GPU failed
        _not_understood(view, warnings, binary, "the device table lists no GPU (%s)"
                        % ("; ".join(table.problems) or "header only"),
                        "GPUs from PCI/sysfs only (health, UUIDs and MetaXLink unknown)")
        return view
    view.available = True
    view.complete = not table.problems
    for problem in table.problems:
        _not_understood(view, warnings, binary, problem, "PCI/sysfs stand in for what it would have said")
    view.maca_version = table.maca_version
    view.driver_version = table.driver_version
    view.by_bdf = {g.bdf: g for g in table.gpus}
    bdf_of = {g.index: g.bdf for g in table.gpus}
    listed = _list(host, binary, table, warnings, known)
    if listed is not None:
        view.ids, problems = listed
        for problem in problems:
            _not_understood(view, warnings, binary, problem, "that GPU has no UUID")
    if topology:
        topo_out = _run(host, binary, ["topo", "-m"], warnings)
        if topo_out is not None:
            try:
                links = mxsmi.parse_topology(topo_out)
            except _PARSE_FAILURES as exc:
                _not_understood(view, warnings, binary, str(exc),
                                "MetaXLink unknown, links from the PCIe tree")
                return view
            unknown = {i for pair in links for i in pair} - set(bdf_of)
            if unknown:
                _not_understood(view, warnings, binary,
                                "`mx-smi topo -m` lists GPUs %s that the device table does not"
                                % sorted(unknown), "MetaXLink unknown, links from the PCIe tree")
                return view
            view.links = {(bdf_of[a], bdf_of[b]): link for (a, b), link in links.items()}
    return view


def _gpu_link(a: Gpu, b: Gpu, view: _MxSmiView) -> LinkClass:
    if view.links is not None:
        key = (a.bdf, b.bdf) if a.bdf < b.bdf else (b.bdf, a.bdf)
        # LinkClass.SYS is 0 (falsy): test for None, or SYS pairs would fall
        # through to the PCIe guess and could be reported closer than they are.
        found = view.links.get(key)
        if found is None:
            found = view.links.get((key[1], key[0]))
        if found is not None:
            return found
    return pci.pci_link(a.pci_path, a.numa_node, b.pci_path, b.numa_node)


def _link_groups(gpus: List[Gpu], link) -> List[LinkGroup]:
    """MetaXLink groups (connected components); other GPUs group by PCIe switch."""
    component = {g.index: g.index for g in gpus}

    def root(index: int) -> int:
        while component[index] != index:
            index = component[index]
        return index

    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            if link(a, b) == LinkClass.MX:
                component[root(b.index)] = root(a.index)
    members: Dict[object, List[int]] = {}
    kinds: Dict[object, str] = {}
    for gpu in gpus:
        key: object = ("mx", root(gpu.index))
        if sum(1 for g in gpus if root(g.index) == root(gpu.index)) > 1:
            kinds[key] = "metaxlink"
        elif gpu.switch is not None:
            key, kinds[("sw", gpu.switch)] = ("sw", gpu.switch), "pcie-switch"
        else:
            kinds[key] = "none"
        members.setdefault(key, []).append(gpu.index)
    groups = [LinkGroup(kinds[key], tuple(sorted(idx))) for key, idx in members.items()]
    return sorted(groups, key=lambda g: g.gpu_indices[0])


def _identity(pf: pci.PciFunction, smi: Optional[mxsmi.MxSmiGpu], listed: Optional[str],
              warnings: List[str]) -> Tuple[str, str, int]:
    """(product, family, memory GiB): the chip name mx-smi gives, else what the PCI device id tells.

    The names are the chip names MetaX's tools and labels use (``MXC500``):
    ``-L``'s name first (it is the chip name, suffix included: ``MXC550-PL``),
    else the table's (``MetaX C500`` -> ``MXC500``). Without either, the PCI
    device id names the product only when no other product shows that id,
    else the family (``MXC``): docs/discovery.md, "Product names".
    """
    known = model.identify_device_id(pf.device_id)
    product = known.product if known else "unknown"
    family = known.family if known else "unknown"
    memory = known.memory_gib if known else 0
    printed = listed if listed and listed.strip() else (smi.name if smi is not None and smi.product else "")
    if printed:
        name = model.chip_name(printed)
        by_name = model.family_of(name)
        if known is not None and known.family not in ("unknown", by_name):
            warnings.append("GPU %s: mx-smi names it %r, its PCI device id 0x%04x is an %s; using mx-smi's name"
                            % (pf.bdf, printed, pf.device_id, known.family))
        product = name
        family = by_name if by_name != "unknown" else family
    if smi is not None and smi.memory_total_mib:
        memory = (smi.memory_total_mib + 512) // 1024
    return product, family, memory


def discover(host: HostRoot, topology: bool = True, known_ids: Optional[KnownIds] = None) -> Inventory:
    """Read the node behind ``host`` (``known_ids``: see :class:`KnownIds`).

    Raises DiscoveryError (with a clear message) only when sysfs cannot be
    read; whatever mx-smi prints that is not understood becomes a warning
    (``Inventory.warnings``, also listed in ``Inventory.unparsed``) and the
    GPUs are still reported from PCI/sysfs.
    """
    if not host.isdir("/"):
        raise DiscoveryError("host root %s does not exist or is not a directory" % host.path)
    if not host.isdir(pci.PCI_DEVICES):
        raise DiscoveryError("%s is missing: is %s a Linux root with sysfs?"
                             % (host.join(pci.PCI_DEVICES), host.path))
    warnings: List[str] = []
    try:
        functions = pci.scan(host)
    except pci.PciScanError as exc:
        raise DiscoveryError(str(exc))
    driver = read_driver(host)
    view = _MxSmiView()
    if functions:
        if driver.loaded:
            view = query_mx_smi(host, warnings, topology=topology, known=known_ids)
        else:
            warnings.append("MetaX driver not loaded (%s missing): GPUs are unhealthy"
                            % host.join(DRIVER_MODULE))
    pfs = [f for f in functions if f.physfn is None]
    vfs_of: Dict[str, List[pci.PciFunction]] = {}
    for function in functions:
        if function.physfn is not None:
            vfs_of.setdefault(function.physfn, []).append(function)

    gpus: List[Gpu] = []
    for index, pf in enumerate(pfs):
        smi = view.by_bdf.get(pf.bdf)
        ids = view.ids.get(pf.bdf, {})
        # A GPU mx-smi does not list is unhealthy only when the table was read
        # whole: a record we could not parse says nothing about the GPU.
        healthy = driver.loaded and pf.driver is not None and (
            not view.available or (smi.available if smi is not None else not view.complete))
        product, family, memory = _identity(pf, smi, ids.get("name"), warnings)
        gpus.append(Gpu(
            index=index, bdf=pf.bdf, pci_device_id=pf.device_id,
            product=product, family=family, memory_gib=memory, numa_node=pf.numa_node, pci_path=pf.path,
            driver_bound=pf.driver is not None, uuid=ids.get("uuid"), serial=ids.get("serial") or pf.serial,
            healthy=healthy, drm_card=pf.drm_card, drm_render=pf.drm_render,
            sriov_totalvfs=pf.sriov_totalvfs, sriov_numvfs=pf.sriov_numvfs,
            vf_bdfs=tuple(v.bdf for v in vfs_of.get(pf.bdf, [])),
        ))

    devices: List[Device] = []
    for gpu in gpus:
        vfs = vfs_of.get(gpu.bdf, [])
        if vfs:
            for vf in vfs:
                devices.append(Device(
                    id=vf.bdf, index=len(devices), gpu_index=gpu.index, bdf=vf.bdf, is_vf=True,
                    numa_node=vf.numa_node, healthy=gpu.healthy and vf.driver is not None,
                    drm_card=vf.drm_card, drm_render=vf.drm_render))
        else:
            devices.append(Device(
                id=gpu.bdf, index=len(devices), gpu_index=gpu.index, bdf=gpu.bdf, is_vf=False,
                numa_node=gpu.numa_node, healthy=gpu.healthy, drm_card=gpu.drm_card,
                drm_render=gpu.drm_render, uuid=gpu.uuid))

    gpu_links = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            gpu_links[pair_key(a.index, b.index)] = _gpu_link(a, b, view)

    def gpu_link(a: Gpu, b: Gpu) -> LinkClass:
        return gpu_links[pair_key(a.index, b.index)]

    def device_link(x: int, y: int) -> LinkClass:
        gx, gy = devices[x].gpu_index, devices[y].gpu_index
        return LinkClass.SAME_GPU if gx == gy else gpu_links[pair_key(gx, gy)]

    # known only when topo -m covered every GPU (a GPU whose table record was
    # unreadable has PCIe-guessed links)
    covered = {bdf for pair in (view.links or {}) for bdf in pair}
    metaxlink_known = view.links is not None and (len(gpus) < 2 or all(g.bdf in covered for g in gpus))
    topo = build_topology((d.index for d in devices), device_link,
                          _link_groups(gpus, gpu_link), metaxlink_known=metaxlink_known)
    sriov = SriovState(capable=any(g.sriov_totalvfs > 0 for g in gpus),
                       totalvfs=max((g.sriov_totalvfs for g in gpus), default=0),
                       numvfs=max((g.sriov_numvfs for g in gpus), default=0))
    if view.driver_version and driver.version and view.driver_version != driver.version:
        warnings.append("mx-smi reports driver %s but the loaded module is %s"
                        % (view.driver_version, driver.version))
    return Inventory(gpus=tuple(gpus), devices=tuple(devices), topology=topo, driver=driver,
                     sriov=sriov, mx_smi_available=view.available, maca_version=view.maca_version,
                     warnings=tuple(warnings), unparsed=tuple(view.unparsed))
