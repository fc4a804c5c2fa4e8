"""The simulated node's IOMMU groups and vfio-pci binding (issue 43), as the kernel has them."""
from __future__ import annotations

import errno
import os
import subprocess

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.host import HostRootError
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

PCI = "sys/bus/pci/devices"
GROUPS = "sys/kernel/iommu_groups"


def write(host, rel, value):
    host.write_attribute(rel, value)


def refused(host, rel, value):
    with pytest.raises(HostRootError) as info:
        host.write_attribute(rel, value)
    return info.value.errno


def to_vfio(host, bdf):
    write(host, "%s/%s/driver_override" % (PCI, bdf), "vfio-pci")
    write(host, "sys/bus/pci/drivers/metax/unbind", bdf)
    write(host, "sys/bus/pci/drivers_probe", bdf)


def driver(host, bdf):
    link = host.readlink("%s/%s/driver" % (PCI, bdf))
    return os.path.basename(link) if link else None


def test_every_function_has_its_own_iommu_group_with_both_links(make_node):
    host = make_node("8xC500")
    bdfs = host.listdir(PCI)
    assert sorted(host.listdir(GROUPS), key=int) == [str(n) for n in range(8)]
    for bdf in bdfs:
        group = os.path.basename(host.readlink("%s/%s/iommu_group" % (PCI, bdf)))
        assert host.listdir("%s/%s/devices" % (GROUPS, group)) == [bdf]
        assert host.realpath("%s/%s/devices/%s" % (GROUPS, group, bdf)) == host.realpath("%s/%s" % (PCI, bdf))
        assert host.read_attribute("%s/%s/driver_override" % (PCI, bdf)) == "(null)"
    assert host.isdir("sys/bus/pci/drivers/vfio-pci") and host.listdir("dev/vfio") == ["vfio"]


def test_vfs_get_groups_and_lose_them(make_node):
    host = make_node("2xC550-sriov")
    pf = host.listdir(PCI)[0]
    write(host, "%s/%s/sriov_numvfs" % (PCI, pf), "4")
    vfs = [b for b in host.listdir(PCI) if host.exists("%s/%s/physfn" % (PCI, b))]
    assert len(vfs) == 4 and all(host.exists("%s/%s/iommu_group" % (PCI, vf)) for vf in vfs)
    assert len(host.listdir(GROUPS)) == 6
    write(host, "%s/%s/sriov_numvfs" % (PCI, pf), "0")
    assert len(host.listdir(GROUPS)) == 2


def test_vfio_pci_takes_a_gpu_only_through_driver_override(make_node):
    host = make_node("8xC500")
    bdf = host.listdir(PCI)[6]
    assert refused(host, "sys/bus/pci/drivers/vfio-pci/bind", bdf) == errno.EBUSY       # metax holds it
    assert refused(host, "sys/bus/pci/drivers/vfio-pci/unbind", bdf) == errno.ENODEV    # not vfio-pci's
    write(host, "sys/bus/pci/drivers/metax/unbind", bdf)
    assert driver(host, bdf) is None and not host.exists("%s/%s/drm" % (PCI, bdf))
    assert refused(host, "sys/bus/pci/drivers/vfio-pci/bind", bdf) == errno.ENODEV      # no id match
    write(host, "%s/%s/driver_override" % (PCI, bdf), "vfio-pci")
    assert refused(host, "sys/bus/pci/drivers/metax/bind", bdf) == errno.ENODEV         # the override rules
    write(host, "sys/bus/pci/drivers/vfio-pci/bind", bdf)
    group = os.path.basename(host.readlink("%s/%s/iommu_group" % (PCI, bdf)))
    assert driver(host, bdf) == "vfio-pci" and host.exists("dev/vfio/" + group)
    # mx-smi no longer sees it: seven GPUs
    listing = subprocess.run([host.join("usr/bin/mx-smi"), "-L"], capture_output=True, text=True, check=True).stdout
    assert bdf not in listing and listing.count("GPU#") == 7


def test_hand_back_clears_everything(make_node):
    host = make_node("8xC500")
    bdf = host.listdir(PCI)[7]
    to_vfio(host, bdf)
    group = os.path.basename(host.readlink("%s/%s/iommu_group" % (PCI, bdf)))
    write(host, "sys/bus/pci/drivers/vfio-pci/unbind", bdf)
    assert not host.exists("dev/vfio/" + group)
    write(host, "%s/%s/driver_override" % (PCI, bdf), "\n")
    assert host.read_attribute("%s/%s/driver_override" % (PCI, bdf)) == "(null)"
    write(host, "sys/bus/pci/drivers_probe", bdf)
    assert driver(host, bdf) == "metax" and host.listdir("%s/%s/drm" % (PCI, bdf))
    assert not generator.load_state(host)["gpus"][7]["vfio"]


def test_metax_letting_a_pf_go_disables_its_vfs(make_node):
    host = make_node("2xC550-sriov")
    pf = host.listdir(PCI)[0]
    write(host, "%s/%s/sriov_numvfs" % (PCI, pf), "4")
    write(host, "sys/bus/pci/drivers/metax/unbind", pf)
    assert host.read_int("%s/%s/sriov_numvfs" % (PCI, pf)) == 0 and len(host.listdir(PCI)) == 2


def test_without_iommu_vfio_pci_refuses_and_the_gpu_stays_unbound(make_node):
    host = make_node("8xC500-noiommu")
    assert host.isdir(GROUPS) and host.listdir(GROUPS) == []
    bdf = host.listdir(PCI)[0]
    assert not host.exists("%s/%s/iommu_group" % (PCI, bdf))
    write(host, "%s/%s/driver_override" % (PCI, bdf), "vfio-pci")
    write(host, "sys/bus/pci/drivers/metax/unbind", bdf)
    assert refused(host, "sys/bus/pci/drivers/vfio-pci/bind", bdf) == errno.EINVAL
    write(host, "sys/bus/pci/drivers_probe", bdf)          # a failed probe is not the write's error
    assert driver(host, bdf) is None and host.listdir("dev/vfio") == ["vfio"]


def test_driver_reload_leaves_vfio_functions_alone(make_node):
    host = make_node("8xC500")
    bdf = host.listdir(PCI)[3]
    to_vfio(host, bdf)
    generator.unload_driver(host)
    assert driver(host, bdf) == "vfio-pci"
    generator.load_driver(host)
    assert driver(host, bdf) == "vfio-pci" and not host.exists("%s/%s/drm" % (PCI, bdf))


def test_unknown_function_and_garbage(make_node):
    host = make_node("1xC500")
    assert refused(host, "sys/bus/pci/drivers/vfio-pci/bind", "0000:ff:00.0") == errno.ENODEV
    assert refused(host, "sys/bus/pci/drivers/nosuch/bind", host.listdir(PCI)[0]) == errno.ENOENT
    assert refused(host, "sys/bus/pci/drivers_probe", "") == errno.ENODEV
