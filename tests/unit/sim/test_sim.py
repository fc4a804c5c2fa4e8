"""The simulated node: tree shape, mx-smi, faults and the kernel emulator."""
from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.host import HostRootError
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.__main__ import main as sim_main
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import GpuSpec, NodeSpec

PCI = "sys/bus/pci/devices"


def mx_smi(host, *args):
    return subprocess.run([host.join("usr/bin/mx-smi")] + list(args), capture_output=True, text=True, check=False)


def test_8xc500_tree_has_switches_numa_and_drm(make_node):
    host = make_node("8xC500")
    bdfs = host.listdir(PCI)
    assert len(bdfs) == 8
    for bdf in bdfs:
        base = "%s/%s" % (PCI, bdf)
        assert host.read_attribute(base + "/vendor") == "0x9999"
        assert host.readlink(base + "/driver").endswith("drivers/metax")
        assert host.listdir(base + "/drm")[0].startswith("card")
        real = host.realpath(base)
        # root complex / root port / switch upstream / switch downstream / gpu
        assert real.startswith("/sys/devices/pci0000:") and len(real.split("/")) == 8
    numa = sorted(host.read_int("%s/%s/numa_node" % (PCI, b)) for b in bdfs)
    assert numa == [0] * 4 + [1] * 4
    assert host.read_attribute("sys/module/metax/version") == "2.14.6"
    assert host.exists("dev/mxcd") and len(host.listdir("dev/dri")) == 16


@pytest.mark.skipif(os.geteuid() != 0, reason="device nodes need root")
def test_device_nodes_are_real_character_devices_as_root(make_node):
    host = make_node("1xC500")
    mode = os.stat(host.join("dev/dri/card0")).st_mode
    assert stat.S_ISCHR(mode)
    assert os.major(os.stat(host.join("dev/dri/renderD128")).st_rdev) == 226


def test_mx_smi_prints_table_list_and_topology(make_node):
    host = make_node("4xN100")
    table = mx_smi(host)
    assert table.returncode == 0 and table.stdout.count("MetaX N100") == 4
    assert "Kernel Mode Driver Version: 2.14.6" in table.stdout
    topo = mx_smi(host, "topo", "-m").stdout
    assert "PIX" in topo and "PHB" in topo and "MX " not in topo.split("Legend")[0]
    assert "Node Affinity  CPU Affinity" in topo      # as 2.2.9 prints it
    listing = mx_smi(host, "-L").stdout.splitlines()
    assert listing[0] == "mx-smi  version: %s" % generator.load_state(host)["mx_smi_version"]
    assert len(listing) == 5 and all(re.match(r"GPU#\d +MXN100 +0000:\S+ +Available \(UUID: GPU-", line)
                                     for line in listing[1:])


def test_list_prints_the_real_form_and_unavailable_gpus(make_node):
    host = make_node("8xC500")
    state = generator.load_state(host)
    with open(os.path.join(SAMPLES, "list-2.2.9-MXC500-excerpt.txt")) as handle:
        sample = handle.read().splitlines()
    listing = mx_smi(host, "-L").stdout.splitlines()
    # the sample's GPU 0 is at another address with another UUID; the rest is printed alike
    gpu0 = state["gpus"][0]
    assert listing[1].replace(gpu0["bdf"], "0000:08:00.0").replace(
        gpu0["uuid"], "GPU-e702f06b-bbd6-bc06-5196-90a5554a24ba") == sample[1]
    generator.fail_gpu(host, 2, mode="smi")
    assert mx_smi(host, "-L").stdout.splitlines()[3] == \
        "GPU#2    MXC500      %s   Not Available(GPU is unavailable)" % state["gpus"][2]["bdf"]


SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu", "fixtures", "mx-smi")


def _shape(line):
    """A line with its numbers and PCI addresses masked and its spacing collapsed: what a layout is made of."""
    line = re.sub(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", "BDF", line)
    return " ".join(re.sub(r"\d+", "#", line).split())


def _capture(name):
    with open(os.path.join(SAMPLES, name)) as handle:
        return handle.read().splitlines()


def test_real_layout_is_the_default_and_matches_the_real_samples(make_node):
    host = make_node("8xC500")
    table = mx_smi(host).stdout.splitlines()
    sample = _capture("table-2.2.9-8xC500.txt")
    # the capture from its version box through GPU 0's record, cell for cell (values masked), same widths
    start = next(i for i, line in enumerate(sample) if line.startswith("+---"))
    ours = next(i for i, line in enumerate(table) if line.startswith("+---"))
    assert [_shape(line) for line in table[ours:ours + 10]] == [_shape(line) for line in sample[start:start + 10]]
    assert {len(line) for line in table if line.startswith(("|", "+"))} == {83}
    # the process table's head and its "no process found", as the capture prints them
    head = sample.index("| Process:                                                                        |")
    assert table[table.index(sample[head]):table.index(sample[head]) + 6] == sample[head:head + 6]
    assert [_shape(line) for line in table[:6] if line.startswith(("===", "Attached", "mx-smi"))] == [
        "mx-smi version: #.#.#", "=================== MetaX System Management Interface Log ===================",
        "Attached GPUs : #"]
    topo = mx_smi(host, "topo", "-m").stdout.splitlines()
    real = _capture("topo-m-2.2.9-8xC500.txt")
    for marker in ("Device link type matrix", "Legend:"):
        assert marker in topo
    header = next(line for line in real if line.strip().startswith("GPU0"))
    assert header in topo
    assert topo[topo.index("Legend:"):] == real[real.index("Legend:"):]
    # a row: GPU, the link cells, Node Affinity, CPU Affinity
    assert [len(line.split()) for line in topo if line.startswith("GPU")] == [11] * 8
    assert topo[topo.index(header) + 1].split()[-2:] == real[real.index(header) + 1].split()[-2:]


def test_legacy_layout_stays_available(make_node):
    host = make_node("4xN100")
    generator.set_mx_smi_layout(host, "legacy")
    assert mx_smi(host).stdout.count("MXN100") == 4
    assert "CPU Affinity" in mx_smi(host, "topo", "-m").stdout
    assert mx_smi(host, "-L").stdout.splitlines()[1].startswith("GPU#0    MXN100      0000:")
    with pytest.raises(generator.SimError, match="layout must be one of real, legacy"):
        generator.set_mx_smi_layout(host, "fancy")
    bad = mx_smi(host, "--frobnicate")
    assert bad.returncode == 2 and "unsupported" in bad.stderr


def test_fail_and_recover_on_the_bus(make_node):
    host = make_node("8xC500")
    generator.fail_gpu(host, 3)
    assert len(host.listdir(PCI)) == 7
    assert mx_smi(host).stdout.count("MetaX C500") == 7
    with pytest.raises(generator.SimError, match="already failed"):
        generator.fail_gpu(host, 3)
    generator.recover_gpu(host, 3)
    assert len(host.listdir(PCI)) == 8
    assert host.exists("dev/dri/card3")


def test_fail_smi_keeps_the_gpu_on_the_bus(make_node):
    host = make_node("8xC500")
    generator.fail_gpu(host, 5, mode="smi")
    assert len(host.listdir(PCI)) == 8
    assert mx_smi(host).stdout.count("Unavailable") == 1


def test_unload_and_load_driver(make_node):
    host = make_node("8xC500")
    generator.unload_driver(host)
    assert not host.exists("sys/module/metax") and not host.exists("dev/mxcd")
    assert host.listdir("dev/dri") == []
    result = mx_smi(host)
    assert result.returncode != 0 and "driver not loaded" in result.stderr
    generator.load_driver(host)
    assert mx_smi(host).returncode == 0 and len(host.listdir("dev/dri")) == 16


def test_sriov_numvfs_write_creates_and_removes_vfs(make_node):
    host = make_node("2xC550-sriov")
    pf = host.listdir(PCI)[0]
    host.write_attribute("%s/%s/sriov_numvfs" % (PCI, pf), "4")
    assert len(host.listdir(PCI)) == 2 + 4
    vf = host.readlink("%s/%s/virtfn0" % (PCI, pf))
    assert vf is not None
    assert host.readlink("%s/%s/physfn" % (PCI, host.listdir(PCI)[1])).endswith(pf)
    # the kernel rule: a non-zero value can only replace 0
    with pytest.raises(HostRootError, match="busy") as busy:
        host.write_attribute("%s/%s/sriov_numvfs" % (PCI, pf), "2")
    assert busy.value.errno == errno.EBUSY
    host.write_attribute("%s/%s/sriov_numvfs" % (PCI, pf), "0")
    with pytest.raises(HostRootError, match="result") as out_of_range:
        host.write_attribute("%s/%s/sriov_numvfs" % (PCI, pf), "16")
    assert out_of_range.value.errno == errno.ERANGE
    with pytest.raises(HostRootError, match="Invalid argument") as garbage:
        host.write_attribute("%s/%s/sriov_numvfs" % (PCI, pf), "four")
    assert garbage.value.errno == errno.EINVAL
    assert len(host.listdir(PCI)) == 2
    host.write_attribute("%s/%s/sriov_numvfs" % (PCI, pf), "8")
    assert host.read_int("%s/%s/sriov_numvfs" % (PCI, pf)) == 8


def test_sriov_refused_on_gpus_without_sriov(make_node):
    host = make_node("1xC500")
    pf = host.listdir(PCI)[0]
    with pytest.raises(HostRootError, match="Invalid argument"):
        host.write_attribute("%s/%s/sriov_numvfs" % (PCI, pf), "2")


def test_create_refuses_foreign_non_empty_dir(tmp_path):
    (tmp_path / "precious").write_text("x")
    with pytest.raises(generator.SimError, match="refusing"):
        generator.create(str(tmp_path), NodeSpec("x", (GpuSpec("C500"),)))
    assert (tmp_path / "precious").exists()


def test_spec_validation_rejects_impossible_layouts():
    with pytest.raises(ValueError, match="two parents"):
        NodeSpec("bad", (GpuSpec("C500", root_port=0, switch_path=(1,)),
                         GpuSpec("C500", root_port=1, switch_path=(1,)))).validate()
    with pytest.raises(ValueError, match="spans NUMA"):
        NodeSpec("bad", (GpuSpec("C500", numa_node=0, switch_path=(1,)),
                         GpuSpec("C500", numa_node=1, switch_path=(1,)))).validate()


def test_cli_round_trip_and_errors(tmp_path, capsys):
    root = str(tmp_path / "n")
    assert sim_main(["create", "--preset", "4xN100", root]) == 0
    assert "4 GPUs" in capsys.readouterr().out
    assert sim_main(["fail", root, "--gpu", "1", "--mode", "smi"]) == 0
    assert sim_main(["fail", root, "--gpu", "9"]) == 2
    assert "no GPU 9" in capsys.readouterr().err
    assert sim_main(["status", str(tmp_path)]) == 2
    assert "not a simulated MetaX node" in capsys.readouterr().err


def test_cli_runs_as_a_module(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-m", "ansible_collections.metax.gpu.plugins.module_utils.sim",
                             "create", "--preset", "8xC500", str(tmp_path / "n")],
                            capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert "8 GPUs" in result.stdout


def test_install_hook_restores_the_kernel_on_an_old_root(make_node, capsys):
    host = make_node("2xC550-sriov")
    hook = host.join(".metax-sim/kernel")
    os.unlink(hook)                       # a root made before the hook existed
    pf = host.listdir(PCI)[0]
    assert not host.is_simulated()
    assert sim_main(["install-hook", host.path]) == 0 and "installed" in capsys.readouterr().out
    host.write_attribute("%s/%s/sriov_numvfs" % (PCI, pf), "2")
    assert len(host.listdir(PCI)) == 2 + 2


def test_install_hook_refuses_a_directory_that_is_not_a_simulated_node(tmp_path, capsys):
    assert sim_main(["install-hook", str(tmp_path)]) == 2
    assert "not a simulated MetaX node" in capsys.readouterr().err
    assert not (tmp_path / ".metax-sim").exists()


def test_install_mx_smi_brings_an_old_root_up_to_date(make_node, tmp_path):
    host = make_node("1xC500")
    with open(host.join("usr/bin/mx-smi"), "w") as handle:
        handle.write("#!/bin/sh\necho 'GPU 0: MXC500 (UUID: GPU-old)'\n")
    assert mx_smi(host, "-L").stdout.startswith("GPU 0: ")
    assert sim_main(["install-mx-smi", host.path]) == 0
    assert mx_smi(host, "-L").stdout.splitlines()[1].startswith("GPU#0    MXC500      0000:")
    # not a simulated node: refused
    assert sim_main(["install-mx-smi", str(tmp_path)]) == 2


def test_install_mx_smi_over_an_older_copy_keeps_state_faults_and_load(make_node):
    from ansible_collections.metax.gpu.plugins.module_utils.gpu import mxsmi_json

    host = make_node("8xC500")
    bdf = generator.load_state(host)["gpus"][2]["bdf"]
    generator.fail_gpu(host, 5, "smi")
    generator.set_load(host, bdf, 0.8)
    # the copy a root made before load.json existed: an idle table, no -j
    with open(host.join(generator.MX_SMI_PATH), "w") as handle:
        handle.write("#!/bin/sh\necho 'mx-smi  version: 2.2.9'\n")
    assert sim_main(["install-mx-smi", host.path]) == 0
    devices = {d.bdf: d for d in mxsmi_json.parse_json(mx_smi(host, "-j").stdout).devices}
    # the load sways between 80 % and 100 % of what was set
    assert 64 <= devices[bdf].utilization_percent <= 80
    assert not devices[generator.load_state(host)["gpus"][5]["bdf"]].available
