# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Write a simulated MetaX node (a host root) from a :class:`NodeSpec`.

The tree mirrors what the product reads on a real node: a sysfs PCI
hierarchy whose parent bridges reveal PCIe switches, MetaX functions with
vendor 0x9999, ``numa_node``, ``sriov_*``, ``driver`` and DRM children; the
driver module version; ``/dev`` nodes; and an ``mx-smi`` executable.

Dynamic state (failed GPUs, driver loaded, VF counts) lives in
``.metax-sim/state.json``; fault injection and the kernel emulator change
the tree and that state together, and ``mx-smi`` prints from the state.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Tuple

from ..gpu.model import METAX_VENDOR_ID, PRODUCTS_BY_NAME, VF_DEVICE_ID_FLAG
from ..host import SIM_STATE_DIR, HostRoot
from ..vfio import sysfs as vfio_sysfs
from .layout import SimError, _Layout, canonical_gpus, vf_bdf
from .spec import NodeSpec, expected_link

STATE_FILE = SIM_STATE_DIR + "/state.json"
LOAD_FILE = SIM_STATE_DIR + "/load.json"     # read by mx-smi at each run (sim/mx_smi.py)
MX_SMI_PATH = "usr/bin/mx-smi"
MX_SMI_LAYOUTS = ("real", "legacy")   # sim/mx_smi.py LAYOUTS; the first is the default
DRIVER_DIR = "sys/bus/pci/drivers/metax"
MXCD_MAJOR = 240          # a dynamic char major, as the MetaX driver gets on real nodes
DRM_MAJOR = 226
RENDER_MINOR_BASE = 128
PCI_BRIDGE_CLASS = "0x060400"
GPU_CLASS = "0x038000"    # display controller, "other"
VFIO_DRIVER_DIR = vfio_sysfs.PCI_DRIVERS + "/" + vfio_sysfs.VFIO_DRIVER
VFIO_GROUP_MAJOR = 511    # dynamic on real nodes, as the MetaX driver's


def _write(path: str, content: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(content)


def _symlink(target_abs: str, link_abs: str) -> None:
    """Relative symlink, so the tree resolves wherever the root is mounted."""
    os.makedirs(os.path.dirname(link_abs), exist_ok=True)
    if os.path.lexists(link_abs):
        os.unlink(link_abs)
    os.symlink(os.path.relpath(target_abs, os.path.dirname(link_abs)), link_abs)


def make_char_device(path: str, major: int, minor: int) -> bool:
    """A real character device when we may (root), else a plain file.

    containerd refuses device specs that are not device nodes, so the local
    cluster (run as root) gets real ones; unprivileged unit tests get files.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    if os.geteuid() == 0:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            return True
        except OSError:
            pass
    _write(path, "")
    return False


def _uuid(node_name: str, index: int) -> str:
    # deterministic, UUID-shaped, distinct per node and GPU
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(node_name)) & 0xFFFFFFFF
    return "GPU-%08x-%04x-%04x-%04x-%012x" % (seed, 0x4d58, index, 0x8000 | index, 0x5e000000 + index)


def _serial(node_name: str, index: int) -> str:
    # the PCIe Device Serial Number discovery reads from sysfs (lspci's form);
    # deterministic and distinct per node and GPU
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(node_name)) & 0xFFFFFF
    value = (0x4D58 << 48) | (seed << 16) | (index + 1)
    return "-".join("%02x" % b for b in value.to_bytes(8, "big"))


def _config_space(device_id: int, serial: Optional[str]) -> bytes:
    """A 4 KiB PCIe config space: IDs and, for a PF, the Device Serial Number capability."""
    data = bytearray(4096)
    struct.pack_into("<HH", data, 0, METAX_VENDOR_ID, device_id)
    if serial is not None:
        # header: capability 0x0003, version 1, no next capability
        struct.pack_into("<IQ", data, 0x100, 0x0003 | (1 << 16), int(serial.replace("-", ""), 16))
    return bytes(data)


def create(root: str, spec: NodeSpec, force: bool = False) -> HostRoot:
    """Create a simulated node at ``root`` (must be empty unless ``force``)."""
    spec.validate()
    if os.path.exists(root) and os.listdir(root):
        if not force and not os.path.isdir(os.path.join(root, SIM_STATE_DIR)):
            raise SimError("%s is not empty and is not a simulated node; refusing to write there" % root)
        for entry in os.listdir(root):
            target = os.path.join(root, entry)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.unlink(target)
    os.makedirs(os.path.join(root, SIM_STATE_DIR), exist_ok=True)
    gpus = canonical_gpus(spec)
    layout = _Layout(gpus)
    layout.build()

    for bridge_dir, _bdf_unused in layout.bridges:
        base = os.path.join(root, bridge_dir)
        _write(os.path.join(base, "class"), PCI_BRIDGE_CLASS + "\n")
        _write(os.path.join(base, "vendor"), "0x8086\n")
    gpu_states: List[Dict[str, Any]] = []
    for index, (gpu, gdir) in enumerate(zip(gpus, layout.gpu_dirs)):
        product = PRODUCTS_BY_NAME[gpu.product]
        gpu_states.append({
            "index": index,
            "bdf": os.path.basename(gdir),
            "sysfs": gdir,
            "product": gpu.product,
            "family": product.family,
            "memory_mib": product.memory_gib * 1024,
            "device_id": product.pci_device_id,
            "numa_node": gpu.numa_node,
            "sriov_totalvfs": gpu.sriov_totalvfs,
            "uuid": _uuid(spec.name, index),
            "serial": _serial(spec.name, index),
            "card": index,
            "failed": None,
            "numvfs": 0,
            "vf_cards": [],
            # the PF's IOMMU group (None without IOMMU), its VFs' groups, and
            # whether vfio-pci holds it (mx-smi then no longer sees it)
            "iommu_group": index if spec.iommu else None,
            "vf_groups": [],
            "vfio": False,
        })
    matrix = [[None if a == b else expected_link(gpus[a], gpus[b]).legend
               for b in range(len(gpus))] for a in range(len(gpus))]
    state = {
        "spec": asdict(spec),
        "gpus": gpu_states,
        "links": matrix,
        "driver_loaded": True,
        "driver_version": spec.driver_version,
        "maca_version": spec.maca_version,
        "mx_smi_version": spec.mx_smi_version,
        "mx_smi_layout": MX_SMI_LAYOUTS[0],
        "seed": sum(ord(c) for c in spec.name),    # mx-smi's readings sway per node, reproducibly
        "next_card": len(gpus),
        "iommu": spec.iommu,
        "next_iommu_group": len(gpus),
    }
    host = HostRoot(root)
    os.makedirs(host.join(vfio_sysfs.IOMMU_GROUPS), exist_ok=True)
    for gpu_state in gpu_states:
        _write_function(host, gpu_state["sysfs"], gpu_state["device_id"], gpu_state["numa_node"],
                        gpu_state["sriov_totalvfs"], serial=gpu_state["serial"])
        if gpu_state["iommu_group"] is not None:
            _join_group(host, gpu_state["sysfs"], gpu_state["iommu_group"])
    _load_vfio(host)
    _install_mx_smi(root)
    _install_kernel_hook(root)
    save_state(host, state)
    load_driver(host)
    return host


def _write_function(host: HostRoot, sysfs_dir: str, device_id: int, numa_node: int,
                    totalvfs: int, physfn: Optional[str] = None, serial: Optional[str] = None) -> None:
    base = host.join(sysfs_dir)
    bdf = os.path.basename(sysfs_dir)
    os.makedirs(base, exist_ok=True)
    with open(os.path.join(base, "config"), "wb") as handle:
        handle.write(_config_space(device_id, serial))
    _write(os.path.join(base, "vendor"), "0x%04x\n" % METAX_VENDOR_ID)
    _write(os.path.join(base, "device"), "0x%04x\n" % device_id)
    _write(os.path.join(base, "class"), GPU_CLASS + "\n")
    _write(os.path.join(base, "numa_node"), "%d\n" % numa_node)
    _write(os.path.join(base, vfio_sysfs.DRIVER_OVERRIDE), vfio_sysfs.NO_OVERRIDE + "\n")
    if physfn is None:
        _write(os.path.join(base, "sriov_totalvfs"), "%d\n" % totalvfs)
        _write(os.path.join(base, "sriov_numvfs"), "0\n")
    else:
        _symlink(host.join(physfn), os.path.join(base, "physfn"))
    _symlink(base, host.join("sys/bus/pci/devices/" + bdf))


def _install_mx_smi(root: str) -> None:
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mx_smi.py")
    with open(source) as handle:
        body = handle.read()
    target = os.path.join(root, MX_SMI_PATH)
    # renamed into place: agents may be running it (sim install-mx-smi on a live node)
    _write(target + ".new", "#!/usr/bin/env python3\n" + body)
    os.chmod(target + ".new", 0o755)
    os.replace(target + ".new", target)


def _install_kernel_hook(root: str) -> None:
    from .kernel import install_hook  # kernel imports this module: import at use

    install_hook(root)


# -- state ------------------------------------------------------------------
def reinstall_mx_smi(host: HostRoot) -> str:
    """Copy this simulator's mx-smi into an existing node (one made before it changed)."""
    load_state(host)        # refuses a directory that is not a simulated node
    _install_mx_smi(host.path)
    return host.join("usr/bin/mx-smi")


def load_state(host: HostRoot) -> dict:
    path = host.join(STATE_FILE)
    if not os.path.isfile(path):
        raise SimError("%s is not a simulated MetaX node (no %s)" % (host.path, STATE_FILE))
    with open(path) as handle:
        return json.load(handle)


def save_state(host: HostRoot, state: dict) -> None:
    host.write_file_atomic(STATE_FILE, json.dumps(state, indent=1, sort_keys=True).encode())


def _gpu(state: dict, index: int) -> dict:
    for gpu in state["gpus"]:
        if gpu["index"] == index:
            return gpu
    raise SimError("no GPU %d on this simulated node (it has %d)" % (index, len(state["gpus"])))


# -- DRM and driver binding ---------------------------------------------------
def _bind(host: HostRoot, sysfs_dir: str, card: int) -> None:
    base = host.join(sysfs_dir)
    _symlink(host.join(DRIVER_DIR), os.path.join(base, "driver"))
    for name in ("card%d" % card, "renderD%d" % (RENDER_MINOR_BASE + card)):
        drm = os.path.join(base, "drm", name)
        os.makedirs(drm, exist_ok=True)
        minor = card if name.startswith("card") else RENDER_MINOR_BASE + card
        _write(os.path.join(drm, "dev"), "%d:%d\n" % (DRM_MAJOR, minor))
        make_char_device(host.join("dev/dri/" + name), DRM_MAJOR, minor)
        _symlink(drm, host.join("sys/class/drm/" + name))


def _unbind(host: HostRoot, sysfs_dir: str, card: int) -> None:
    base = host.join(sysfs_dir)
    if driver_of(host, sysfs_dir) == vfio_sysfs.METAX_DRIVER:
        os.unlink(os.path.join(base, "driver"))
    shutil.rmtree(os.path.join(base, "drm"), ignore_errors=True)
    for name in ("card%d" % card, "renderD%d" % (RENDER_MINOR_BASE + card)):
        for path in (host.join("dev/dri/" + name), host.join("sys/class/drm/" + name)):
            if os.path.lexists(path):
                os.unlink(path)


def _functions(gpu: dict) -> List[Tuple[str, int]]:
    """(sysfs dir, card) of a GPU's PF and its VFs."""
    funcs = [(gpu["sysfs"], gpu["card"])]
    parent = os.path.dirname(gpu["sysfs"])
    for k, card in enumerate(gpu["vf_cards"], start=1):
        funcs.append(("%s/%s" % (parent, vf_bdf(gpu["bdf"], k)), card))
    return funcs


def load_driver(host: HostRoot) -> None:
    state = load_state(host)
    _write(host.join("sys/module/metax/version"), state["driver_version"] + "\n")
    _write(host.join("sys/module/metax/refcnt"), "0\n")
    os.makedirs(host.join(DRIVER_DIR), exist_ok=True)
    make_char_device(host.join("dev/mxcd"), MXCD_MAJOR, 0)
    for gpu in state["gpus"]:
        if gpu["failed"] != "bus":
            for sysfs_dir, card in _functions(gpu):
                # a function held by another driver, or meant for one, is not probed by metax
                if driver_of(host, sysfs_dir) is None and override_of(host, sysfs_dir) in (
                        vfio_sysfs.NO_OVERRIDE, vfio_sysfs.METAX_DRIVER):
                    _bind(host, sysfs_dir, card)
    state["driver_loaded"] = True
    save_state(host, state)


def unload_driver(host: HostRoot) -> None:
    state = load_state(host)
    for gpu in state["gpus"]:
        for sysfs_dir, card in _functions(gpu):
            _unbind(host, sysfs_dir, card)
        # the GPU's error counters are the driver's: a reload starts them at zero (the remediation
        # ladder's driver reload, docs/health.md); retired pages are the GPU's own and stay
        retired = (gpu.get("ecc") or {}).get("retired_dbe")
        for key in ("ecc", "pci_events", "ras", "mxlk_aer"):
            gpu.pop(key, None)
        if retired:
            gpu["ecc"] = {"retired_dbe": retired}
    shutil.rmtree(host.join("sys/module/metax"), ignore_errors=True)
    shutil.rmtree(host.join(DRIVER_DIR), ignore_errors=True)
    if os.path.lexists(host.join("dev/mxcd")):
        os.unlink(host.join("dev/mxcd"))
    state["driver_loaded"] = False
    save_state(host, state)


def set_driver_version(host: HostRoot, version: str) -> None:
    """What a driver upgrade leaves behind (used by driver tests and the demo)."""
    state = load_state(host)
    state["driver_version"] = version
    save_state(host, state)
    if state["driver_loaded"]:
        _write(host.join("sys/module/metax/version"), version + "\n")


def set_mx_smi_layout(host: HostRoot, layout: str) -> None:
    """``real`` (default): what MetaX machines print; ``legacy``: the simulator's old guess."""
    if layout not in MX_SMI_LAYOUTS:
        raise SimError("mx-smi layout must be one of %s, not %r" % (", ".join(MX_SMI_LAYOUTS), layout))
    state = load_state(host)
    state["mx_smi_layout"] = layout
    save_state(host, state)


def set_mx_smi_version(host: HostRoot, version: str) -> None:
    """What ``mx-smi`` says its version is; before 2.2.12 it refuses ``-j`` (no JSON)."""
    if not all(part.isdigit() for part in version.split(".")):
        raise SimError("mx-smi version must look like 2.2.12, not %r" % version)
    state = load_state(host)
    state["mx_smi_version"] = version
    save_state(host, state)


# -- load (what mx-smi reports as utilisation, memory, power...) --------------
def device_bdfs(host: HostRoot) -> List[str]:
    """PCI addresses of every simulated PF and VF present now."""
    out = []
    for gpu in load_state(host)["gpus"]:
        out.append(gpu["bdf"])
        out.extend(vf_bdf(gpu["bdf"], k) for k in range(1, gpu["numvfs"] + 1))
    return out


def read_load(host: HostRoot) -> Dict[str, Dict[str, float]]:
    path = host.join(LOAD_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def set_load(host: HostRoot, bdf: str, utilization: float, processes: Optional[int] = None) -> None:
    """Put a workload on a PF or VF: mx-smi reports it busy at about ``utilization`` (0-1).

    ``utilization`` 0 removes the load. The readings that follow from it are
    in sim/mx_smi.py; every one is a function of the seed and the time.
    """
    if bdf not in device_bdfs(host):
        raise SimError("no device %s on this simulated node" % bdf)
    if not 0.0 <= utilization <= 1.0:
        raise SimError("utilization must be between 0 and 1, not %s" % utilization)
    loads = read_load(host)
    if utilization == 0:
        loads.pop(bdf, None)
    else:
        loads[bdf] = {"utilization": utilization, "processes": 1 if processes is None else processes}
    host.write_file_atomic(LOAD_FILE, json.dumps(loads, indent=1, sort_keys=True).encode())


def clear_load(host: HostRoot) -> None:
    load_state(host)        # refuses a directory that is not a simulated node
    if os.path.exists(host.join(LOAD_FILE)):
        os.unlink(host.join(LOAD_FILE))


# -- faults -------------------------------------------------------------------
def fail_gpu(host: HostRoot, index: int, mode: str = "bus") -> None:
    """``bus``: the GPU falls off the bus; ``smi``: mx-smi reports it unavailable."""
    if mode not in ("bus", "smi"):
        raise SimError("fault mode must be 'bus' or 'smi', not %r" % mode)
    state = load_state(host)
    gpu = _gpu(state, index)
    if gpu["failed"]:
        raise SimError("GPU %d has already failed (%s)" % (index, gpu["failed"]))
    if mode == "bus":
        stash = host.join(SIM_STATE_DIR + "/removed/%d" % index)
        shutil.rmtree(stash, ignore_errors=True)
        os.makedirs(stash)
        for sysfs_dir, card in _functions(gpu):
            _unbind(host, sysfs_dir, card)
            if driver_of(host, sysfs_dir) == vfio_sysfs.VFIO_DRIVER:
                unbind_vfio(host, sysfs_dir, state)
            bdf = os.path.basename(sysfs_dir)
            link = host.join("sys/bus/pci/devices/" + bdf)
            if os.path.lexists(link):
                os.unlink(link)
            shutil.move(host.join(sysfs_dir), os.path.join(stash, bdf))
    gpu["failed"] = mode
    save_state(host, state)


def recover_gpu(host: HostRoot, index: int) -> None:
    """Undo ``fail``: the GPU back on the bus and available, its injected counters zero."""
    from .signals import clear_signals     # here: signals builds on this module's state helpers
    had_signals = clear_signals(host, index)
    state = load_state(host)
    gpu = _gpu(state, index)
    if not gpu["failed"]:
        if had_signals:
            return
        raise SimError("GPU %d has not failed" % index)
    if gpu["failed"] == "bus":
        stash = host.join(SIM_STATE_DIR + "/removed/%d" % index)
        for sysfs_dir, card in _functions(gpu):
            bdf = os.path.basename(sysfs_dir)
            shutil.move(os.path.join(stash, bdf), host.join(sysfs_dir))
            _symlink(host.join(sysfs_dir), host.join("sys/bus/pci/devices/" + bdf))
            if state["driver_loaded"] and override_of(host, sysfs_dir) in (
                    vfio_sysfs.NO_OVERRIDE, vfio_sysfs.METAX_DRIVER):
                _bind(host, sysfs_dir, card)
        shutil.rmtree(stash, ignore_errors=True)
    gpu["failed"] = None
    save_state(host, state)


# -- SR-IOV (called by the kernel emulator) -------------------------------------
def set_numvfs(host: HostRoot, pf_sysfs_dir: str, numvfs: int) -> None:
    """Create or remove VFs below a PF, as the kernel does on ``sriov_numvfs`` writes."""
    state = load_state(host)
    gpu = next((g for g in state["gpus"] if g["sysfs"] == pf_sysfs_dir), None)
    if gpu is None:
        raise SimError("%s is not a MetaX physical function" % pf_sysfs_dir)
    parent = os.path.dirname(pf_sysfs_dir)
    base = host.join(pf_sysfs_dir)
    for k in range(len(gpu["vf_cards"]), 0, -1):
        vf_dir = "%s/%s" % (parent, vf_bdf(gpu["bdf"], k))
        _unbind(host, vf_dir, gpu["vf_cards"][k - 1])
        link = host.join("sys/bus/pci/devices/" + vf_bdf(gpu["bdf"], k))
        if os.path.lexists(link):
            os.unlink(link)
        if os.path.lexists(os.path.join(base, "virtfn%d" % (k - 1))):
            os.unlink(os.path.join(base, "virtfn%d" % (k - 1)))
        if driver_of(host, vf_dir) == vfio_sysfs.VFIO_DRIVER:
            unbind_vfio(host, vf_dir, state)
        _leave_group(host, vf_dir)
        shutil.rmtree(host.join(vf_dir), ignore_errors=True)
    gpu["vf_cards"] = []
    gpu["vf_groups"] = []
    for k in range(1, numvfs + 1):
        vf_dir = "%s/%s" % (parent, vf_bdf(gpu["bdf"], k))
        _write_function(host, vf_dir, gpu["device_id"] | VF_DEVICE_ID_FLAG, gpu["numa_node"], 0,
                        physfn=pf_sysfs_dir)
        _symlink(host.join(vf_dir), os.path.join(base, "virtfn%d" % (k - 1)))
        card = state["next_card"]
        state["next_card"] += 1
        gpu["vf_cards"].append(card)
        if state.get("iommu", True):
            group = state.get("next_iommu_group", len(state["gpus"]))
            state["next_iommu_group"] = group + 1
            gpu.setdefault("vf_groups", []).append(group)
            _join_group(host, vf_dir, group)
        if state["driver_loaded"]:
            _bind(host, vf_dir, card)
    gpu["numvfs"] = numvfs
    _write(os.path.join(base, "sriov_numvfs"), "%d\n" % numvfs)
    save_state(host, state)


def gpu_sysfs_dirs(host: HostRoot) -> Dict[str, str]:
    """BDF -> sysfs dir of every PF (for tests and the kernel emulator)."""
    return {g["bdf"]: g["sysfs"] for g in load_state(host)["gpus"]}


# -- IOMMU groups and vfio-pci -------------------------------------------------
def _join_group(host: HostRoot, sysfs_dir: str, group: int) -> None:
    """Function ``sysfs_dir`` in IOMMU group ``group``: both links, as the kernel makes them."""
    group_dir = host.join("%s/%s" % (vfio_sysfs.IOMMU_GROUPS, group))
    _symlink(host.join(sysfs_dir), os.path.join(group_dir, "devices", os.path.basename(sysfs_dir)))
    _symlink(group_dir, os.path.join(host.join(sysfs_dir), vfio_sysfs.IOMMU_GROUP_LINK))


def _leave_group(host: HostRoot, sysfs_dir: str) -> None:
    group = group_of(host, sysfs_dir)
    if group is None:
        return
    group_dir = host.join("%s/%s" % (vfio_sysfs.IOMMU_GROUPS, group))
    link = os.path.join(group_dir, "devices", os.path.basename(sysfs_dir))
    if os.path.lexists(link):
        os.unlink(link)
    if not os.listdir(os.path.join(group_dir, "devices")):
        shutil.rmtree(group_dir, ignore_errors=True)


def group_of(host: HostRoot, sysfs_dir: str) -> Optional[int]:
    """A function's IOMMU group, None without one (no IOMMU)."""
    target = os.readlink(host.join(sysfs_dir + "/" + vfio_sysfs.IOMMU_GROUP_LINK)) \
        if os.path.islink(host.join(sysfs_dir + "/" + vfio_sysfs.IOMMU_GROUP_LINK)) else None
    return int(os.path.basename(target)) if target else None


def driver_of(host: HostRoot, sysfs_dir: str) -> Optional[str]:
    link = host.join(sysfs_dir + "/driver")
    return os.path.basename(os.readlink(link)) if os.path.islink(link) else None


def override_of(host: HostRoot, sysfs_dir: str) -> str:
    path = host.join(sysfs_dir + "/" + vfio_sysfs.DRIVER_OVERRIDE)
    if not os.path.exists(path):
        return vfio_sysfs.NO_OVERRIDE
    with open(path) as handle:
        return handle.read().strip() or vfio_sysfs.NO_OVERRIDE


def _load_vfio(host: HostRoot) -> None:
    """vfio-pci loaded (as ``modprobe vfio-pci`` leaves it): its driver directory and /dev/vfio/vfio."""
    os.makedirs(host.join(VFIO_DRIVER_DIR), exist_ok=True)
    make_char_device(host.join(vfio_sysfs.VFIO_CONTAINER), vfio_sysfs.VFIO_CONTAINER_MAJOR,
                     vfio_sysfs.VFIO_CONTAINER_MINOR)


def find_function(state: dict, sysfs_dir: str) -> Tuple[dict, int]:
    """(the GPU, its card number) of a PF's or VF's sysfs dir."""
    for gpu in state["gpus"]:
        for func_dir, card in _functions(gpu):
            if func_dir == sysfs_dir:
                return gpu, card
    raise SimError("%s is not a MetaX function of this simulated node" % sysfs_dir)


def bind_metax(host: HostRoot, sysfs_dir: str) -> None:
    """The metax driver probes a function (bind, drivers_probe)."""
    state = load_state(host)
    _gpu_unused, card = find_function(state, sysfs_dir)
    _bind(host, sysfs_dir, card)


def unbind_metax(host: HostRoot, sysfs_dir: str) -> None:
    """The metax driver lets a function go; a PF's remove() disables its SR-IOV first, as PF drivers do."""
    state = load_state(host)
    gpu, card = find_function(state, sysfs_dir)
    if sysfs_dir == gpu["sysfs"] and gpu["numvfs"]:
        set_numvfs(host, sysfs_dir, 0)
    _unbind(host, sysfs_dir, card)


def bind_vfio(host: HostRoot, sysfs_dir: str) -> int:
    """vfio-pci takes a function: its driver link and its group's /dev/vfio/<N>; returns the group."""
    group = group_of(host, sysfs_dir)
    if group is None:
        raise SimError("%s has no IOMMU group" % sysfs_dir)
    _symlink(host.join(VFIO_DRIVER_DIR), host.join(sysfs_dir + "/driver"))
    node = host.join("%s/%s" % (vfio_sysfs.VFIO_DEV_DIR, group))
    if not os.path.lexists(node):
        make_char_device(node, VFIO_GROUP_MAJOR, group)
    state = load_state(host)
    gpu, _card = find_function(state, sysfs_dir)
    if sysfs_dir == gpu["sysfs"]:
        gpu["vfio"] = True
        save_state(host, state)
    return group


def unbind_vfio(host: HostRoot, sysfs_dir: str, state: Optional[dict] = None) -> None:
    """vfio-pci lets a function go; the group's node goes with its last vfio-pci function.

    ``state``: the caller's loaded state, updated in place (the caller saves it)."""
    link = host.join(sysfs_dir + "/driver")
    if os.path.islink(link):
        os.unlink(link)
    group = group_of(host, sysfs_dir)
    if group is not None:
        members = host.listdir("%s/%d/devices" % (vfio_sysfs.IOMMU_GROUPS, group))
        held = [m for m in members if driver_of(host, host.realpath("%s/%d/devices/%s" % (
            vfio_sysfs.IOMMU_GROUPS, group, m)).lstrip("/")) == vfio_sysfs.VFIO_DRIVER]
        node = host.join("%s/%s" % (vfio_sysfs.VFIO_DEV_DIR, group))
        if not held and os.path.lexists(node):
            os.unlink(node)
    own = state if state is not None else load_state(host)
    for gpu in own["gpus"]:
        if gpu["sysfs"] == sysfs_dir:
            gpu["vfio"] = False
    if state is None:
        save_state(host, own)
