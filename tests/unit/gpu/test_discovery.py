"""Discovery against simulated nodes: presets, faults, missing/broken mx-smi, random topologies."""
from __future__ import annotations

import dataclasses
import os
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import DiscoveryError, discover
from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import (
    PRODUCTS_BY_NAME, LinkClass, chip_name, identify_device_id,
)
from ansible_collections.metax.gpu.plugins.module_utils.gpu.mxsmi import parse_table
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import GpuSpec, NodeSpec, expected_link, preset


def groups(inv):
    return [(g.kind, g.gpu_indices) for g in inv.topology.link_groups]


def test_8xc500(make_node):
    inv = discover(make_node("8xC500"))
    assert inv.gpu_count == 8 and len(inv.devices) == 8
    assert groups(inv) == [("metaxlink", (0, 1, 2, 3)), ("metaxlink", (4, 5, 6, 7))]
    assert inv.topology.link(0, 1) == LinkClass.MX and inv.topology.link(3, 4) == LinkClass.SYS
    assert inv.driver.loaded and inv.driver.version == "2.14.6"
    assert inv.sriov.status == "forbidden" and inv.mx_smi_available and inv.maca_version
    assert all(g.healthy and g.uuid and g.product == "MXC500" and g.memory_gib == 64 for g in inv.gpus)
    assert [g.numa_node for g in inv.gpus] == [0] * 4 + [1] * 4
    assert len({g.switch for g in inv.gpus}) == 2
    assert inv.devices[2].drm_card == "card2" and inv.devices[2].drm_render == "renderD130"


def test_4xn100_has_no_metaxlink(make_node):
    inv = discover(make_node("4xN100"))
    assert groups(inv) == [("pcie-switch", (0, 1)), ("pcie-switch", (2, 3))]
    assert inv.topology.link(0, 1) == LinkClass.PIX and inv.topology.link(1, 2) == LinkClass.PHB
    assert inv.gpus[0].family == "MXN" and inv.topology.metaxlink_known


def test_sriov_vfs_become_devices(make_node):
    host = make_node("2xC550-sriov")
    inv = discover(host)
    assert inv.sriov.status == "off" and inv.sriov.totalvfs == 8
    for gpu in inv.gpus:
        host.write_attribute("/sys/bus/pci/devices/%s/sriov_numvfs" % gpu.bdf, "4")
    inv = discover(host)
    assert inv.gpu_count == 2 and len(inv.devices) == 8
    assert inv.sriov.status == "on" and inv.sriov.numvfs == 4
    assert all(d.is_vf and d.drm_card for d in inv.devices)
    assert inv.topology.link(0, 1) == LinkClass.SAME_GPU
    assert inv.topology.link(0, 4) == LinkClass.MX


def test_failed_gpu_disappears_or_turns_unhealthy(make_node):
    host = make_node("8xC500")
    generator.fail_gpu(host, 3)
    generator.fail_gpu(host, 6, mode="smi")
    inv = discover(host)
    assert inv.gpu_count == 7
    assert [g.healthy for g in inv.gpus].count(False) == 1
    assert not next(g for g in inv.gpus if g.bdf == "0000:45:00.0").healthy
    # -L prints it "Not Available(...)" with no UUID: reported, and that GPU alone has none
    assert [g.uuid is None for g in inv.gpus].count(True) == 1
    assert next(g for g in inv.gpus if g.bdf == "0000:45:00.0").uuid is None
    assert any("Not Available" in w and "(line 7:" in w for w in inv.warnings)


def test_uuids_from_the_real_list_form_and_serials_from_sysfs(make_node):
    host = make_node("8xC500")
    state = generator.load_state(host)
    inv = discover(host)
    assert [g.uuid for g in inv.gpus] == [g["uuid"] for g in state["gpus"]]
    assert [g.serial for g in inv.gpus] == [g["serial"] for g in state["gpus"]]
    assert len({g.serial for g in inv.gpus}) == 8 and re.match(r"^([0-9a-f]{2}-){7}[0-9a-f]{2}$", inv.gpus[0].serial)
    # the real sample's lines, at this node's addresses and in another order:
    # matched by PCI address, not by the index
    with open(os.path.join(SAMPLES, "list-2.2.9-MXC500-excerpt.txt")) as handle:
        real = handle.read().splitlines()
    listing = [real[0], real[2].replace("0000:3c:00.0", BDFS_8XC500[7]).replace("GPU#7", "GPU#0"),
               real[1].replace("0000:08:00.0", BDFS_8XC500[0]).replace("GPU#0", "GPU#7")]
    with open(os.path.join(SAMPLES, REAL_TOPO)) as handle:
        fake_mx_smi_printing(host, real_table_for(BDFS_8XC500), handle.read(), "\n".join(listing))
    inv = discover(host)
    assert inv.warnings == ()
    assert inv.gpus[0].uuid == "GPU-e702f06b-bbd6-bc06-5196-90a5554a24ba"
    assert inv.gpus[7].uuid == "GPU-0e715b45-bcef-1500-e2db-752724095700"
    assert [g.uuid for g in inv.gpus[1:7]] == [None] * 6


def test_sriov_vfs_have_no_serial_of_their_own(make_node):
    inv = discover(make_node("2xC550-sriov"))
    assert all(g.serial for g in inv.gpus)


def test_driver_unloaded_reports_pci_only(make_node):
    host = make_node("8xC500")
    generator.unload_driver(host)
    inv = discover(host)
    assert inv.gpu_count == 8 and not inv.driver.loaded
    assert not any(g.healthy for g in inv.gpus)
    assert not inv.topology.metaxlink_known
    # without mx-smi, MetaXLink pairs fall back to their PCIe class
    assert inv.topology.link(0, 1) == LinkClass.PIX
    assert any("driver not loaded" in w for w in inv.warnings)


def test_without_mx_smi_metaxlink_is_unknown(make_node):
    host = make_node("8xC500")
    os.unlink(host.join("usr/bin/mx-smi"))
    inv = discover(host)
    assert not inv.mx_smi_available and not inv.topology.metaxlink_known
    assert groups(inv) == [("pcie-switch", (0, 1, 2, 3)), ("pcie-switch", (4, 5, 6, 7))]
    assert all(g.healthy for g in inv.gpus)
    assert any("mx-smi not found" in w for w in inv.warnings)


def test_sys_from_topo_is_kept_not_replaced_by_the_pcie_guess(make_node):
    # LinkClass.SYS == 0: a truthiness test once dropped it and reported the
    # PCIe class (PIX here: GPU0 and GPU1 share a switch) instead.
    host = make_node("8xC500")
    state = generator.load_state(host)
    state["links"][0][1] = state["links"][1][0] = "SYS"
    generator.save_state(host, state)
    inv = discover(host)
    assert inv.topology.metaxlink_known
    assert inv.topology.link(0, 1) == LinkClass.SYS
    assert inv.topology.link(0, 2) == LinkClass.MX


def write_fake_mx_smi(host, script):
    path = host.join("usr/bin/mx-smi")
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n" + script + "\n")
    os.chmod(path, 0o755)


def test_garbage_mx_smi_degrades_to_pci_with_a_warning(make_node):
    host = make_node("8xC500")
    write_fake_mx_smi(host, "echo '| 0  MXC500 | not-a-bdf | 0% |'")
    inv = discover(host)
    assert inv.gpu_count == 8 and len(inv.devices) == 8 and not inv.mx_smi_available
    assert all(g.healthy and g.product == "MXC" and g.family == "MXC" and g.memory_gib == 64 for g in inv.gpus)
    assert not inv.topology.metaxlink_known and inv.topology.link(0, 1) == LinkClass.PIX
    assert len(inv.unparsed) == 1 and inv.unparsed[0] in inv.warnings
    assert host.join("usr/bin/mx-smi") in inv.unparsed[0] and "not-a-bdf" in inv.unparsed[0]
    assert "(line 1:" in inv.unparsed[0]


def test_failing_mx_smi_is_a_warning(make_node):
    host = make_node("8xC500")
    write_fake_mx_smi(host, "echo 'NVML-like init failure' >&2; exit 3")
    inv = discover(host)
    assert inv.gpu_count == 8 and not inv.mx_smi_available
    assert any("exited 3: NVML-like init failure" in w for w in inv.warnings)


def test_missing_root_and_missing_sysfs(tmp_path):
    with pytest.raises(DiscoveryError, match="does not exist"):
        discover(HostRoot(str(tmp_path / "nope")))
    with pytest.raises(DiscoveryError, match="sys/bus/pci/devices is missing"):
        discover(HostRoot(str(tmp_path)))


def test_no_metax_gpu_is_not_an_error(tmp_path):
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    inv = discover(HostRoot(str(tmp_path)))
    assert inv.gpu_count == 0 and inv.devices == () and not inv.driver.loaded


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_unreadable_sysfs_file_names_the_file(make_node):
    host = make_node("1xC500")
    bdf = host.listdir("sys/bus/pci/devices")[0]
    os.chmod(host.join("sys/bus/pci/devices/%s/device" % bdf), 0)
    with pytest.raises(DiscoveryError, match="device: Permission denied"):
        discover(host)


def test_garbage_sysfs_attribute_names_the_file(make_node):
    host = make_node("1xC500")
    bdf = host.listdir("sys/bus/pci/devices")[0]
    with open(host.join("sys/bus/pci/devices/%s/numa_node" % bdf), "w") as handle:
        handle.write("banana\n")
    with pytest.raises(DiscoveryError, match="numa_node: expected an integer, got 'banana'"):
        discover(host)


# -- property: any generated topology is discovered exactly as generated --------------------
@st.composite
def node_specs(draw):
    count = draw(st.integers(min_value=1, max_value=10))
    gpus = []
    for _gpu in range(count):
        rc = draw(st.integers(0, 2))
        port = draw(st.integers(0, 2))
        depth = draw(st.integers(0, 2))
        path = []
        if depth >= 1:
            path.append(1000 * rc + 100 * port + draw(st.integers(0, 1)))
        if depth >= 2:
            path.append(path[0] * 10 + draw(st.integers(0, 1)))
        gpus.append(GpuSpec(draw(st.sampled_from(["C500", "C550", "N100"])), numa_node=rc % 2,
                            root_complex=rc, root_port=port, switch_path=tuple(path),
                            metaxlink_group=draw(st.one_of(st.none(), st.integers(0, 2)))))
    spec = NodeSpec("random", tuple(gpus))
    try:
        spec.validate()
    except ValueError:
        assume(False)
    return spec


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(spec=node_specs(), with_mx_smi=st.booleans())
def test_any_generated_topology_is_discovered_as_generated(tmp_path_factory, spec, with_mx_smi):
    root = str(tmp_path_factory.mktemp("node"))
    host = generator.create(root, spec)
    if not with_mx_smi:
        os.unlink(host.join("usr/bin/mx-smi"))
    inv = discover(host)
    ordered = generator.canonical_gpus(spec)
    assert inv.gpu_count == len(ordered)
    # mx-smi names the chip; without it the PCI id names the product only where no other shows that id
    assert [g.product for g in inv.gpus] == [
        chip_name(g.product) if with_mx_smi else identify_device_id(PRODUCTS_BY_NAME[g.product].pci_device_id).product
        for g in ordered]
    assert [g.numa_node for g in inv.gpus] == [g.numa_node for g in ordered]
    for a in range(len(ordered)):
        for b in range(a + 1, len(ordered)):
            want = expected_link(ordered[a], ordered[b])
            if not with_mx_smi and want == LinkClass.MX:
                want = expected_link(dataclasses.replace(ordered[a], metaxlink_group=None), ordered[b])
            assert inv.topology.link(a, b) == want, (a, b)
    assert inv.topology.metaxlink_known == with_mx_smi


# -- real mx-smi layouts and degradation (issue 17) -------------------------------------------
SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "mx-smi")
BDFS_8XC500 = ["0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0",
               "0000:43:00.0", "0000:44:00.0", "0000:45:00.0", "0000:46:00.0"]


REAL_TABLE = "table-2.2.9-8xC500.txt"
REAL_TOPO = "topo-m-2.2.9-8xC500.txt"      # two MetaXLink groups of four, NODE across


def real_table_for(bdfs):
    """The real 2.2.9 capture of 8 x C500, its PCI addresses replaced by ``bdfs`` (in order)."""
    with open(os.path.join(SAMPLES, REAL_TABLE)) as handle:
        text = handle.read()
    from ansible_collections.metax.gpu.plugins.module_utils.gpu.mxsmi import parse_table as parse
    printed = [g.bdf for g in parse(text).gpus]
    assert len(printed) == len(bdfs)
    for old, new in zip(printed, bdfs):
        text = text.replace(old, new)
    # the simulated node's driver (else discovery rightly warns that mx-smi reports another one)
    return text.replace("Kernel Mode Driver Version: 3.4.4 ", "Kernel Mode Driver Version: 2.14.6")


def fake_mx_smi_printing(host, table, topo, listing=""):
    for name, text in (("table", table), ("topo", topo), ("list", listing)):
        with open(host.join("usr/bin/mx-smi.%s" % name), "w") as handle:
            handle.write(text + "\n")
    write_fake_mx_smi(host, 'd=$(dirname "$0")\ncase "$1" in\n  topo) cat "$d/mx-smi.topo";;\n'
                      '  -L) cat "$d/mx-smi.list";;\n  *) cat "$d/mx-smi.table";;\nesac')


def test_real_samples_discovered_on_8xc500(make_node):
    host = make_node("8xC500")
    assert [g.bdf for g in discover(host).gpus] == BDFS_8XC500
    with open(os.path.join(SAMPLES, REAL_TOPO)) as handle:
        fake_mx_smi_printing(host, real_table_for(BDFS_8XC500), handle.read())
    inv = discover(host)
    assert inv.warnings == () and inv.mx_smi_available and inv.topology.metaxlink_known
    assert all(g.healthy and g.product == "MXC500" and g.family == "MXC" and g.memory_gib == 64 for g in inv.gpus)
    assert groups(inv) == [("metaxlink", (0, 1, 2, 3)), ("metaxlink", (4, 5, 6, 7))]
    assert inv.topology.link(0, 3) == LinkClass.MX and inv.topology.link(3, 4) == LinkClass.NODE


def test_legacy_layout_is_discovered_alike(make_node):
    real = discover(make_node("2xC550-sriov"))
    host = make_node("2xC550-sriov")
    generator.set_mx_smi_layout(host, "legacy")
    legacy = discover(host)
    assert legacy.warnings == () and legacy.to_dict() == real.to_dict()


def test_one_unreadable_record_keeps_that_gpu_healthy_from_pci(make_node):
    host = make_node("8xC500")
    table = real_table_for(BDFS_8XC500).replace("0000:05:00.0", "0000:zz:00.0")
    with open(os.path.join(SAMPLES, REAL_TOPO)) as handle:
        fake_mx_smi_printing(host, table, handle.read())
    inv = discover(host)
    assert inv.gpu_count == 8 and all(g.healthy for g in inv.gpus)
    assert len(inv.unparsed) >= 1 and "0000:zz:00.0" in inv.unparsed[0] and "(line 18:" in inv.unparsed[0]
    # topo -m now names a GPU the table lost: MetaXLink unknown rather than guessed
    assert not inv.topology.metaxlink_known and any("topo -m" in w for w in inv.unparsed)


def test_unreadable_topology_degrades_to_the_pcie_tree(make_node):
    host = make_node("8xC500")
    fake_mx_smi_printing(host, real_table_for(BDFS_8XC500), "GPU0 GPU1\nGPU0 X ??\nGPU1 ?? X")
    inv = discover(host)
    assert inv.mx_smi_available and all(g.healthy for g in inv.gpus)
    assert not inv.topology.metaxlink_known and inv.topology.link(0, 1) == LinkClass.PIX
    assert len(inv.unparsed) == 1 and "topo -m" in inv.unparsed[0]
    assert "MetaXLink unknown" in inv.unparsed[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.one_of(st.text(max_size=300), st.sampled_from(["", "|", "| Bus-id |\n| x |", "+--+\n|==|"])),
       topo=st.text(max_size=200), listing=st.text(max_size=100))
def test_garbage_from_mx_smi_never_leaves_discovery(tmp_path_factory, table, topo, listing):
    host = generator.create(str(tmp_path_factory.mktemp("node")), preset("4xN100"))
    fake_mx_smi_printing(host, table, topo, listing)
    inv = discover(host)
    assert inv.gpu_count == 4 and len(inv.devices) == 4
    if inv.unparsed or not inv.mx_smi_available:
        # nothing understood about a GPU is no reason to call it unhealthy
        assert all(g.healthy for g in inv.gpus)
    for warning in inv.unparsed:
        assert "mx-smi" in warning and warning in inv.warnings


def test_metaxlink_known_only_when_topo_covers_every_gpu(make_node):
    host = make_node("8xC500")
    table = real_table_for(BDFS_8XC500).replace("0000:05:00.0", "0000:zz:00.0")
    with open(os.path.join(SAMPLES, REAL_TOPO)) as handle:
        rows = [line.split() for line in handle.read().splitlines()]
    # GPU2's row and column taken out: topo -m agrees with the table that GPU2 is not there
    keep = [i for i in range(8) if i != 2]
    topo = ["\t" + "\t".join("GPU%d" % i for i in keep)]
    first = next(n for n, row in enumerate(rows) if row[:2] == ["GPU0", "X"])
    topo += ["GPU%d\t" % i + "\t".join(rows[first + i][1 + j] for j in keep) for i in keep]
    fake_mx_smi_printing(host, table, "\n".join(topo))
    inv = discover(host)
    assert all(g.healthy for g in inv.gpus) and inv.topology.link(0, 1) == LinkClass.MX
    assert not inv.topology.metaxlink_known          # GPU2's links are PCIe guesses
    assert len(inv.unparsed) == 2 and "0000:zz:00.0" in inv.unparsed[0]
    assert "8 GPUs attached, 7 read from the table" in inv.unparsed[1]


def test_mx_smi_that_cannot_run_degrades_like_one_that_fails(make_node):
    # found on the local cluster: an mx-smi of the wrong format ("Exec format
    # error") made every scan fail, and gpu-device marked every device Unhealthy
    host = make_node("8xC500")
    with open(host.join("usr/bin/mx-smi"), "wb") as handle:
        handle.write(b"\x7fELF\x02\x01\x01 not for this machine")
    inv = discover(host)
    assert inv.gpu_count == 8 and all(g.healthy for g in inv.gpus) and not inv.mx_smi_available
    assert any("could not be run" in w and "Exec format error" in w for w in inv.warnings), inv.warnings


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_real_layouts_never_leave_discovery_nor_fail_a_gpu(tmp_path_factory, data):
    host = generator.create(str(tmp_path_factory.mktemp("node")), preset("8xC500"))
    with open(os.path.join(SAMPLES, REAL_TOPO)) as handle:
        texts = [real_table_for(BDFS_8XC500).splitlines(), handle.read().splitlines()]
    for lines in texts:
        for _step in range(data.draw(st.integers(0, 3))):
            at = data.draw(st.integers(0, len(lines) - 1))
            action = data.draw(st.sampled_from(["drop", "dup", "swap", "widen", "cut"]))
            if action == "drop" and len(lines) > 1:
                del lines[at]
            elif action == "dup":
                lines.insert(at, lines[at])
            elif action == "swap":
                other = data.draw(st.integers(0, len(lines) - 1))
                lines[at], lines[other] = lines[other], lines[at]
            elif action == "widen":
                lines[at] = lines[at].replace(" |", "      | ").replace("  ", "\t")
            else:
                lines[at] = lines[at][:data.draw(st.integers(0, max(0, len(lines[at]) - 1)))]
    fake_mx_smi_printing(host, "\n".join(texts[0]), "\n".join(texts[1]))
    inv = discover(host)
    assert [g.bdf for g in inv.gpus] == BDFS_8XC500
    # no mutation here says a GPU is unavailable: only a GPU mx-smi no longer
    # prints at all, in a table that is otherwise read whole, may be unhealthy
    # (topo's own warning that it lists that GPU is a consequence, not a misread)
    table = "\n".join(texts[0])
    for gpu in inv.gpus:
        assert gpu.healthy or (gpu.bdf not in table and not parse_table(table).problems), inv.warnings
    # the chip name where mx-smi was read, the family where only the PCI id speaks (never a wrong product)
    assert all(g.product in ("MXC500", "MXC") and g.family == "MXC" and g.memory_gib == 64 for g in inv.gpus)
    if inv.topology.metaxlink_known:
        assert groups(inv) == [("metaxlink", (0, 1, 2, 3)), ("metaxlink", (4, 5, 6, 7))]


# -- product names: the chip names MetaX's tools and labels use (issue 38) -------------------------
def _sample_rows_for(name, bdfs):
    """A real table sample with its PCI addresses replaced by the simulated node's (same GPU count)."""
    with open(os.path.join(SAMPLES, name)) as handle:
        text = handle.read()
    from ansible_collections.metax.gpu.plugins.module_utils.gpu.mxsmi import parse_table as parse
    for gpu, bdf in zip(parse(text).gpus, bdfs):
        text = text.replace(gpu.bdf, bdf)
    return text


@pytest.mark.parametrize("sample, printed_as", [
    ("table-2.1.6-4xMXC500-processes.txt", "MXC500"),
    ("table-2.2.4-8xC550.txt", "MXC550"),
    ("table-2.2.9-8xC500.txt", "MXC500"),
])
def test_every_real_table_sample_names_the_chip_through_discovery(make_node, sample, printed_as):
    host = make_node("8xC500")
    text = _sample_rows_for(sample, BDFS_8XC500)
    fake_mx_smi_printing(host, text, "garbage")
    inv = discover(host, topology=False)
    read = [g for g in inv.gpus if g.bdf in text]
    assert read and all(g.product == printed_as and g.family == "MXC" and g.memory_gib == 64 for g in read)


def test_the_chip_name_of_mx_smi_l_wins_suffix_included(make_node):
    host = make_node("8xC500")
    listing = "\n".join("GPU#%d    MXC550-PL   %s   Available (UUID: GPU-%d)" % (i, bdf, i)
                        for i, bdf in enumerate(BDFS_8XC500))
    fake_mx_smi_printing(host, real_table_for(BDFS_8XC500), "garbage", listing)
    inv = discover(host, topology=False)
    assert {g.product for g in inv.gpus} == {"MXC550-PL"} and {g.family for g in inv.gpus} == {"MXC"}
    assert all(g.uuid == "GPU-%d" % g.index for g in inv.gpus)


def test_pci_fallback_names_the_family_where_an_id_is_shared_and_the_product_where_not(make_node):
    for preset, product, family, memory in (("8xC500", "MXC", "MXC", 64), ("2xC550-sriov", "MXC", "MXC", 64),
                                            ("4xN100", "MXN100", "MXN", 16)):
        host = make_node(preset)
        os.unlink(host.join("usr/bin/mx-smi"))
        inv = discover(host)
        assert {(g.product, g.family, g.memory_gib) for g in inv.gpus} == {(product, family, memory)}, preset
    # a real MXC500 shows 9999:4001 in lspci, and so does the simulated one
    assert identify_device_id(0x4001).product == "MXC" and not identify_device_id(0x4001).exact
    assert PRODUCTS_BY_NAME["C500"].pci_device_id == 0x4001 == PRODUCTS_BY_NAME["MXC500"].pci_device_id


def test_mx_smi_naming_another_family_than_the_pci_id_warns_and_wins(make_node):
    host = make_node("8xC500")
    fake_mx_smi_printing(host, real_table_for(BDFS_8XC500).replace("MetaX C500", "MetaX N260"), "garbage")
    inv = discover(host, topology=False)
    assert {g.product for g in inv.gpus} == {"MXN260"} and {g.family for g in inv.gpus} == {"MXN"}
    assert sum("mx-smi names it 'MetaX N260', its PCI device id 0x4001 is an MXC" in w for w in inv.warnings) == 8
