# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Where the kernel keeps what vfio needs (node paths, under a HostRoot).

The simulator writes the same tree (sim/generator.py), the backend and the
vfio-manager read and write it; neither imports the other.
"""

from __future__ import annotations

# /sys/kernel/iommu_groups/<N>/devices/<bdf>: links to the functions of group N.
# The directory exists whenever the kernel has the IOMMU API; it is empty when
# the IOMMU is off (no intel_iommu=on / amd_iommu, or disabled in the firmware).
IOMMU_GROUPS = "sys/kernel/iommu_groups"
# A function's own link to its group
IOMMU_GROUP_LINK = "iommu_group"
PCI_DRIVERS = "sys/bus/pci/drivers"
# The kernel's generic probe: writing a BDF binds the function to its
# driver_override's driver (or to the first driver whose id table matches)
DRIVERS_PROBE = "sys/bus/pci/drivers_probe"
DRIVER_OVERRIDE = "driver_override"
# What driver_override reads when unset
NO_OVERRIDE = "(null)"
METAX_DRIVER = "metax"
VFIO_DRIVER = "vfio-pci"
# /dev/vfio/vfio: the container node (misc 10:196); /dev/vfio/<N>: group N's
# node, present while a function of the group is bound to vfio-pci
VFIO_DEV_DIR = "dev/vfio"
VFIO_CONTAINER = VFIO_DEV_DIR + "/vfio"
VFIO_CONTAINER_MAJOR = 10
VFIO_CONTAINER_MINOR = 196
