# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Kernel reactions to attribute writes on a simulated node.

Runs as a separate process: the generator installs ``.metax-sim/kernel``
(see :func:`install_hook`) in every simulated root, and
:meth:`HostRoot.write_attribute` executes it instead of writing the file. So
code under test writes sysfs exactly as on a real node and sees the same
errors, while no module ever imports this file: writing ``sriov_numvfs``
creates or removes ``virtfn*`` VFs, a non-zero value cannot replace another
non-zero value (EBUSY), values above ``sriov_totalvfs`` give ERANGE, and
garbage or SR-IOV on a GPU without it gives EINVAL. Driver binding as
``drivers/<drv>/bind``, ``unbind``, ``drivers_probe`` and ``driver_override``
have it: a bound function refuses another bind (EBUSY), a driver unbinds only
its own functions (ENODEV), ``driver_override`` decides which driver may take a
function (any other: ENODEV; vfio-pci, which matches no MetaX id by itself,
only through it), and vfio-pci refuses a function without an IOMMU group
(EINVAL), creating ``/dev/vfio/<group>`` when it takes one.

Hook protocol (docs/simulated-node.md): ``kernel write <node-path>``, value
on stdin; exit status 0 or the errno, reason on stderr.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import List, Optional

from ..errors import MetaxGpuError
from ..host import SIM_KERNEL_HOOK, HostRoot
from ..vfio import sysfs as vfio_sysfs
from . import generator


class KernelRefusal(MetaxGpuError):
    """The kernel's answer to a write: an errno."""

    def __init__(self, code: int) -> None:
        super().__init__(os.strerror(code))
        self.code = code


class SimulatedKernel:
    def __init__(self, host: HostRoot) -> None:
        self.host = host

    def write_attribute(self, rel: str, value: str) -> None:
        """Apply a write as the kernel would; raises KernelRefusal."""
        node_path = self.host.realpath(rel)
        name, parent = os.path.basename(node_path), os.path.dirname(node_path)
        if name == "sriov_numvfs":
            self._sriov_numvfs(node_path, value)
            return
        if name == vfio_sysfs.DRIVER_OVERRIDE:
            self._driver_override(parent, value)
            return
        if name in ("bind", "unbind") and os.path.dirname(parent) == "/" + vfio_sysfs.PCI_DRIVERS:
            getattr(self, "_" + name)(os.path.basename(parent), value.strip())
            return
        if node_path == "/" + vfio_sysfs.DRIVERS_PROBE:
            self._drivers_probe(value.strip())
            return
        path = self.host.join(node_path)
        if not os.path.exists(path):
            raise KernelRefusal(errno.ENOENT)
        with open(path, "w") as handle:
            handle.write(value)

    def _sriov_numvfs(self, node_path: str, value: str) -> None:
        pf_dir = os.path.dirname(node_path).lstrip("/")
        try:
            wanted = int(value.strip(), 0)
        except ValueError:
            raise KernelRefusal(errno.EINVAL)
        total = self.host.read_int(pf_dir + "/sriov_totalvfs", default=0)
        current = self.host.read_int(pf_dir + "/sriov_numvfs", default=0)
        if wanted < 0 or wanted > total:
            raise KernelRefusal(errno.ERANGE if total else errno.EINVAL)
        if wanted == current:
            return
        if wanted and current:
            raise KernelRefusal(errno.EBUSY)
        held_by = generator.driver_of(self.host, pf_dir)
        if held_by is not None and held_by != vfio_sysfs.METAX_DRIVER:
            # another driver (vfio-pci without enable_sriov) configures no SR-IOV
            raise KernelRefusal(errno.ENOENT)
        if wanted and not self.host.exists("sys/module/metax"):
            # no PF driver bound: the kernel refuses to enable SR-IOV
            raise KernelRefusal(errno.ENOENT)
        generator.set_numvfs(self.host, pf_dir, wanted)

    # -- driver binding ----------------------------------------------------
    def _device_dir(self, bdf: str) -> str:
        """The sysfs dir (no leading slash) of a PCI function; ENODEV when there is none."""
        link = "%s/%s" % ("sys/bus/pci/devices", bdf)
        if not bdf or "/" in bdf or not self.host.exists(link):
            raise KernelRefusal(errno.ENODEV)
        return self.host.realpath(link).lstrip("/")

    def _driver_override(self, device_dir: str, value: str) -> None:
        path = self.host.join(device_dir + "/" + vfio_sysfs.DRIVER_OVERRIDE)
        if not os.path.exists(path):
            raise KernelRefusal(errno.ENOENT)
        wanted = value.rstrip("\n")
        if "\n" in wanted or len(wanted) >= 4096:
            raise KernelRefusal(errno.EINVAL)
        # an empty write clears the override, as the kernel's driver_override_store does
        with open(path, "w") as handle:
            handle.write((wanted or vfio_sysfs.NO_OVERRIDE) + "\n")

    def _matches(self, device_dir: str, driver: str) -> bool:
        """pci_match_device: the override alone when set; else the driver's id table."""
        override = generator.override_of(self.host, device_dir)
        if override != vfio_sysfs.NO_OVERRIDE:
            return override == driver
        if driver != vfio_sysfs.METAX_DRIVER:
            return False        # vfio-pci's table is empty until new_id (not used here)
        return self.host.read_attribute(device_dir + "/vendor", default="") == "0x%04x" % generator.METAX_VENDOR_ID

    def _attach(self, device_dir: str, driver: str) -> None:
        if driver == vfio_sysfs.VFIO_DRIVER:
            if generator.group_of(self.host, device_dir) is None:
                # vfio_pci_probe: no IOMMU group, no vfio
                raise KernelRefusal(errno.EINVAL)
            generator.bind_vfio(self.host, device_dir)
        else:
            generator.bind_metax(self.host, device_dir)

    def _bind(self, driver: str, bdf: str) -> None:
        if not self.host.isdir("%s/%s" % (vfio_sysfs.PCI_DRIVERS, driver)):
            raise KernelRefusal(errno.ENOENT)
        device_dir = self._device_dir(bdf)
        if generator.driver_of(self.host, device_dir) is not None:
            raise KernelRefusal(errno.EBUSY)
        if not self._matches(device_dir, driver):
            raise KernelRefusal(errno.ENODEV)
        self._attach(device_dir, driver)

    def _unbind(self, driver: str, bdf: str) -> None:
        device_dir = self._device_dir(bdf)
        if generator.driver_of(self.host, device_dir) != driver:
            raise KernelRefusal(errno.ENODEV)
        if driver == vfio_sysfs.VFIO_DRIVER:
            generator.unbind_vfio(self.host, device_dir)
        else:
            generator.unbind_metax(self.host, device_dir)

    def _drivers_probe(self, bdf: str) -> None:
        """Bind an unbound function to the first loaded driver that matches; no match is no error."""
        device_dir = self._device_dir(bdf)
        if generator.driver_of(self.host, device_dir) is not None:
            return
        for driver in (vfio_sysfs.VFIO_DRIVER, vfio_sysfs.METAX_DRIVER):
            if self.host.isdir("%s/%s" % (vfio_sysfs.PCI_DRIVERS, driver)) and self._matches(device_dir, driver):
                try:
                    self._attach(device_dir, driver)
                except KernelRefusal:
                    pass        # a failed probe leaves the function unbound; the write itself succeeds
                return


def _collections_dir() -> str:
    """The directory holding ``ansible_collections`` this code was imported from."""
    parts = os.path.abspath(__file__).split(os.sep)
    if "ansible_collections" not in parts:
        raise RuntimeError("the simulator must be imported as ansible_collections.metax.gpu")
    cut = len(parts) - 1 - parts[::-1].index("ansible_collections")
    return os.sep.join(parts[:cut]) or os.sep


HOOK_TEMPLATE = """#!/usr/bin/env python3
# Simulated kernel of a metax.gpu simulated node (written by sim.generator).
# HostRoot.write_attribute runs this instead of writing sysfs; see
# docs/simulated-node.md. Not present, and never consulted, on a real node.
import os
import sys

sys.path.insert(0, %(collections)r)
from ansible_collections.metax.gpu.plugins.module_utils.sim.kernel import main

sys.exit(main(sys.argv[1:], os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
"""


def install_hook(root: str) -> str:
    """Write the executable kernel hook into a simulated root; returns its path."""
    target = os.path.join(root, SIM_KERNEL_HOOK)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = target + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(HOOK_TEMPLATE % {"collections": _collections_dir()})
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def main(argv: List[str], root: Optional[str] = None) -> int:
    """Hook entry point: ``write <node-path>`` with the value on stdin."""
    if len(argv) != 2 or argv[0] != "write":
        sys.stderr.write("usage: kernel write <node-path>  (value on stdin)\n")
        return errno.EINVAL
    host = HostRoot(root or os.environ.get("METAX_HOST_ROOT", ""))
    value = sys.stdin.read()
    try:
        SimulatedKernel(host).write_attribute(argv[1], value)
    except KernelRefusal as refusal:
        sys.stderr.write("%s\n" % refusal)
        return refusal.code
    except generator.SimError as exc:
        sys.stderr.write("%s: %s\n" % (os.strerror(errno.EINVAL), exc))
        return errno.EINVAL
    return 0
