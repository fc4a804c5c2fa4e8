"""metax.gpu.driver with payloads whose own version is not the kernel driver's (MetaX's 2.29.0.13 installs
2.12.13), and with MetaX's prebuilt layout (modules + mx-smi + declaration), on simulated nodes.

Both numbering schemes go through install, verify, an idempotent re-run and a rollback."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.driver import backend
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator, pkgtool
from ansible_collections.metax.gpu.plugins.modules import driver

from module_runner import run_module, tree

CACHE = "var/cache/metax-driver"
VENDOR, VENDOR_KMD = "2.29.0.13", "2.12.13"      # a real node: payload 2.29.0.13, gpu.driver.* 2/12/13


def _loaded(host):
    return host.read_attribute("sys/module/metax/version", default="") or None


@pytest.fixture
def deb_node(make_node):
    host = make_node("1xC500")
    pkgtool.install_tools(host.path, "deb")
    # the driver the node runs now, as a package in the cache: what a rollback goes back to
    pkgtool.make_package(host.join(CACHE), "deb", _loaded(host))
    return host


@pytest.mark.parametrize("kind", ["deb", "run"])
def test_a_vendor_numbered_package_installs_verifies_and_stays_put(deb_node, kind):
    host = deb_node
    old = _loaded(host)
    pkgtool.make_package(host.join(CACHE), kind, VENDOR, driver_version=VENDOR_KMD)
    pkgtool.make_declaration(host.join(CACHE), VENDOR, VENDOR_KMD, per_version=True)
    args = {"host_root": host.path, "version": VENDOR, "src": "/" + CACHE}
    failed, predicted = run_module(driver, args, check_mode=True)
    assert not failed, predicted
    plan = predicted["plan"]
    assert (plan["from_version"], plan["to_version"], plan["to_driver_version"]) == (old, VENDOR, VENDOR_KMD)
    assert plan["from_driver_version"] == old and "kernel driver 2.12.13" in plan["reason"]
    failed, result = run_module(driver, args)
    assert not failed, result
    # the loaded module says the declared kernel driver; verify compared it with that, not with 2.29.0.13
    assert _loaded(host) == VENDOR_KMD and result["verify"]["version_ok"]
    assert result["after"]["package_version"] == VENDOR and result["after"]["package_driver_version"] == VENDOR_KMD
    # the next run sees the node on target: no reload of a module whose number is not the payload's
    failed, again = run_module(driver, args)
    assert not failed and again["changed"] is False, again["plan"]
    failed, again = run_module(driver, {"host_root": host.path})          # no version, no src: also at rest
    assert not failed and again["changed"] is False, again["plan"]
    # rollback to the previous payload (the same-numbered scheme), verified against its own number
    failed, back = run_module(driver, {"host_root": host.path, "version": old, "src": "/" + CACHE})
    assert not failed, back
    assert _loaded(host) == old and back["plan"]["to_driver_version"] == old
    assert back["after"]["package_driver_version"] == old


def test_a_vendor_payload_without_its_module_loaded_is_reloaded_to_the_declared_driver(deb_node):
    host = deb_node
    pkgtool.make_package(host.join(CACHE), "deb", VENDOR, driver_version=VENDOR_KMD)
    pkgtool.make_declaration(host.join(CACHE), VENDOR, VENDOR_KMD, per_version=True)
    assert not run_module(driver, {"host_root": host.path, "version": VENDOR, "src": "/" + CACHE})[0]
    generator.set_driver_version(host, "2.12.11")        # something else got loaded since
    failed, result = run_module(driver, {"host_root": host.path, "version": VENDOR})
    assert not failed, result
    assert result["plan"]["steps"] == ["unload", "load"] and result["plan"]["to_driver_version"] == VENDOR_KMD


def test_a_prebuilt_tree_installs_for_the_running_kernel_and_rolls_back_to_a_package(deb_node):
    host = deb_node
    old = _loaded(host)
    tree_dir = pkgtool.make_prebuilt(host.join(CACHE + "/driver-image-" + VENDOR), VENDOR, VENDOR_KMD)
    # an index the image was built with: never copied over the node's (depmod writes the node's own)
    for release in (pkgtool.SIM_KERNEL_RELEASE, os.uname().release):
        with open(os.path.join(tree_dir, "lib", "modules", release, "modules.dep"), "w") as handle:
            handle.write("extra/metax/metax.ko:\n")
    os.makedirs(host.join("lib/modules/%s" % pkgtool.SIM_KERNEL_RELEASE))
    with open(host.join("lib/modules/%s/modules.dep" % pkgtool.SIM_KERNEL_RELEASE), "w") as handle:
        handle.write("kernel/drivers/node-own.ko:\n")
    args = {"host_root": host.path, "version": VENDOR, "src": "/" + CACHE}
    failed, result = run_module(driver, args)
    assert not failed, result
    assert result["plan"]["package"]["kind"] == "prebuilt"
    assert result["plan"]["package"]["kernels"] == sorted({pkgtool.SIM_KERNEL_RELEASE, os.uname().release})
    assert result["plan"]["steps"] == ["unload", "remove", "install", "load"]     # the deb goes first
    assert _loaded(host) == VENDOR_KMD and result["verify"]["version_ok"]
    assert result["after"]["package_kind"] == "prebuilt" and result["after"]["package_version"] == VENDOR
    record = json.loads(host.read_text(backend.PREBUILT_RECORD))
    module = "lib/modules/%s/extra/metax/metax.ko" % pkgtool.SIM_KERNEL_RELEASE
    assert record["files"] == [module] and host.exists(module)       # the node's own mx-smi was kept
    assert os.path.isfile(os.path.join(tree_dir, "usr", "bin", "mx-smi"))
    failed, again = run_module(driver, args)
    assert not failed and again["changed"] is False, again["plan"]
    # back to the deb: the prebuilt files leave with their directories, the deb's module loads
    failed, back = run_module(driver, {"host_root": host.path, "version": old, "src": "/" + CACHE})
    assert not failed, back
    assert back["plan"]["steps"] == ["unload", "remove", "install", "load"] and _loaded(host) == old
    assert not host.exists(module) and not host.exists("lib/modules/%s/extra" % pkgtool.SIM_KERNEL_RELEASE)
    assert not host.exists(backend.PREBUILT_RECORD)
    assert host.read_text("lib/modules/%s/modules.dep" % pkgtool.SIM_KERNEL_RELEASE) == "kernel/drivers/node-own.ko:\n"


def test_prebuilt_mx_smi_is_installed_where_the_node_has_none_and_removed_with_it(deb_node):
    host = deb_node
    os.rename(host.join("usr/bin/mx-smi"), host.join("usr/bin/mx-smi.sim"))
    pkgtool.make_prebuilt(host.join(CACHE + "/image"), VENDOR, VENDOR_KMD)
    failed, result = run_module(driver, {"host_root": host.path, "version": VENDOR, "src": "/" + CACHE})
    assert not failed, result
    assert "usr/bin/mx-smi" in json.loads(host.read_text(backend.PREBUILT_RECORD))["files"]
    assert result["verify"]["mx_smi"]
    failed, gone = run_module(driver, {"host_root": host.path, "state": "absent"})
    assert not failed, gone
    assert not host.exists("usr/bin/mx-smi") and _loaded(host) is None
    assert not host.exists(backend.DRIVER_RECORD)


def test_a_prebuilt_tree_for_another_kernel_is_refused_and_nothing_changes(deb_node):
    host = deb_node
    pkgtool.make_prebuilt(host.join(CACHE + "/image"), VENDOR, VENDOR_KMD, kernels=["4.18.0-other"])
    before = tree(host.path)
    failed, result = run_module(driver, {"host_root": host.path, "version": VENDOR, "src": "/" + CACHE})
    assert failed and "kernel %s" % pkgtool.SIM_KERNEL_RELEASE in result["msg"] and "4.18.0-other" in result["msg"]
    assert tree(host.path) == before


def test_the_deb_of_a_payload_wins_over_its_prebuilt_tree_and_both_declare_the_same_driver(deb_node):
    host = deb_node
    pkgtool.make_payload(host.join(CACHE + "/payload"), VENDOR, VENDOR_KMD, layouts=("deb", "prebuilt"))
    found = backend.scan_src(host, "/" + CACHE + "/payload", "metax-driver")
    assert sorted(p.kind for p in found) == ["prebuilt"]          # deb/ is a subdirectory of packages, not scanned
    found = backend.scan_src(host, "/" + CACHE + "/payload/deb", "metax-driver")
    assert [(p.kind, p.driver) for p in found] == [("deb", VENDOR)]  # no declaration beside it: same number
    # a payload staged flat (driver-manager's cache): packages, declaration and tree side by side
    flat = host.join(CACHE + "/flat")
    pkgtool.make_package(flat, "deb", VENDOR, driver_version=VENDOR_KMD)
    pkgtool.make_declaration(flat, VENDOR, VENDOR_KMD)
    pkgtool.make_prebuilt(os.path.join(flat, "prebuilt"), VENDOR, VENDOR_KMD)
    found = backend.scan_src(host, "/" + CACHE + "/flat", "metax-driver")
    assert sorted((p.kind, p.driver) for p in found) == [("deb", VENDOR_KMD), ("prebuilt", VENDOR_KMD)]
    failed, result = run_module(driver, {"host_root": host.path, "version": VENDOR, "src": "/" + CACHE + "/flat"})
    assert not failed and result["plan"]["package"]["kind"] == "deb" and _loaded(host) == VENDOR_KMD


def test_a_bad_declaration_is_an_error_that_names_the_file(deb_node):
    host = deb_node
    pkgtool.make_package(host.join(CACHE), "deb", VENDOR)
    with open(host.join(CACHE + "/metax-driver-bad.version"), "w") as handle:
        handle.write("version=2.29.0.13\ndriver=latest\n")
    before = tree(host.path)
    failed, result = run_module(driver, {"host_root": host.path, "version": VENDOR, "src": "/" + CACHE})
    assert failed and "metax-driver-bad.version" in result["msg"] and "driver='latest'" in result["msg"]
    assert tree(host.path) == before


def test_a_broken_prebuilt_driver_fails_verification_and_says_why(deb_node):
    host = deb_node
    pkgtool.make_prebuilt(host.join(CACHE + "/image"), VENDOR, VENDOR_KMD, broken=True)
    failed, result = run_module(driver, {"host_root": host.path, "version": VENDOR, "src": "/" + CACHE})
    assert failed and "/dev/mxcd missing" in result["msg"]
    assert _loaded(host) == VENDOR_KMD          # loaded (wrong kernel build), probing nothing


def test_the_simulators_depmod_follows_the_modules_on_disk(deb_node):
    host = deb_node
    old = _loaded(host)
    tree_dir = pkgtool.make_prebuilt(host.join("tmp/tree"), VENDOR, VENDOR_KMD)
    module = "lib/modules/%s/extra/metax/metax.ko" % pkgtool.SIM_KERNEL_RELEASE
    os.makedirs(os.path.dirname(host.join(module)))
    with open(os.path.join(tree_dir, module)) as src, open(host.join(module), "w") as dst:
        dst.write(src.read())
    assert pkgtool.main("depmod", ["-a"], host.path) == 0
    assert generator.load_state(host)["disk_driver"]["version"] == VENDOR_KMD
    os.unlink(host.join(module))
    assert pkgtool.main("depmod", ["-a", pkgtool.SIM_KERNEL_RELEASE], host.path) == 0
    assert generator.load_state(host)["disk_driver"]["version"] == old      # the deb's module again
