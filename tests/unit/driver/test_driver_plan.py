"""The driver plan as a pure function: packages, policies, states, in-use refusal."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from ansible_collections.metax.gpu.plugins.module_utils.driver import backend, package
from ansible_collections.metax.gpu.plugins.module_utils.driver.backend import Observed, Request, plan
from ansible_collections.metax.gpu.plugins.module_utils.driver.package import Package


@pytest.mark.parametrize("filename,kind,version", [
    ("metax-driver_2.33.0.7_amd64.deb", "deb", "2.33.0.7"),
    ("metax-driver_2.33.0.7-1_amd64.deb", "deb", "2.33.0.7"),
    ("metax-driver-2.33.0.7-1.x86_64.rpm", "rpm", "2.33.0.7"),
    ("metax-driver-2.33.0.7-x86_64.run", "run", "2.33.0.7"),
])
def test_package_names_of_each_kind_parse(filename, kind, version):
    parsed = package.parse("/x/" + filename, "metax-driver")
    assert (parsed.kind, parsed.version) == (kind, version)


def test_other_files_are_ignored_and_a_named_bad_file_is_an_error():
    found = package.candidates(["/d/README", "/d/other-tool_1.0_amd64.deb", "/d/metax-driver_2.1_amd64.deb",
                                "/d/metax-driverx_3.0_amd64.deb"], "metax-driver")
    assert [p.version for p in found] == ["2.1"]
    with pytest.raises(package.DriverPackageError):
        package.parse("/d/metax-driver_latest_amd64.deb", "metax-driver")


def test_choose_is_numeric_prefers_native_and_never_crosses_kinds():
    pkgs = package.candidates(["/d/metax-driver_2.9.1_amd64.deb", "/d/metax-driver_2.10.0_amd64.deb",
                               "/d/metax-driver-2.10.0-x86_64.run", "/d/metax-driver-2.11.0-1.x86_64.rpm"],
                              "metax-driver")
    assert package.choose(pkgs, "deb", None).path.endswith("2.10.0_amd64.deb")
    assert package.choose(pkgs, "rpm", None).kind == "rpm"
    assert package.choose(pkgs, None, None).kind == "run"
    assert package.choose(pkgs, "deb", "2.11.0") is None


def seen(loaded="2.1", pkg="2.1", kind="deb", packages=(), in_use=()):
    return Observed(node_kind="deb", loaded_version=loaded, package_version=pkg,
                    package_kind=kind if pkg else None, mxcd=loaded is not None,
                    packages=list(packages), in_use=list(in_use))


NEW = Package("/c/metax-driver_2.2_amd64.deb", "deb", "2.2")
OLD = Package("/c/metax-driver_2.1_amd64.deb", "deb", "2.1")


def test_same_version_is_a_no_op_and_always_reinstalls():
    assert plan(Request(version="2.1", src="/c"), seen(packages=[OLD])).steps == []
    assert plan(Request(version="2.1", src="/c", deploy_policy="Always"),
                seen(packages=[OLD])).steps == ["unload", "install", "load"]


def test_upgrade_latest_and_downgrade():
    up = plan(Request(version="2.2", src="/c"), seen(packages=[OLD, NEW]))
    assert up.steps == ["unload", "install", "load"] and (up.from_version, up.to_version) == ("2.1", "2.2")
    assert plan(Request(state="latest", src="/c"), seen(packages=[OLD, NEW])).to_version == "2.2"
    down = plan(Request(version="2.1", src="/c"), seen(loaded="2.2", pkg="2.2", packages=[OLD, NEW]))
    assert down.reason.startswith("downgrade")


def test_never_only_verifies():
    assert plan(Request(version="2.1", deploy_policy="Never"), seen()).steps == []
    with pytest.raises(backend.DriverError, match="Never"):
        plan(Request(version="2.2", deploy_policy="Never"), seen())
    with pytest.raises(backend.DriverError, match="no MetaX driver"):
        plan(Request(deploy_policy="Never"), seen(loaded=None, pkg=None))


def test_installed_but_other_version_loaded_reloads():
    result = plan(Request(version="2.2"), seen(loaded="2.1", pkg="2.2"))
    assert result.steps == ["unload", "load"]
    assert plan(Request(), seen(loaded=None, pkg="2.2")).steps == ["load"]


def test_in_use_refuses_unless_forced_but_not_when_nothing_unloads():
    busy = seen(packages=[NEW], in_use=["pod ml/a requests metax-tech.com/gpu"])
    with pytest.raises(backend.DriverInUseError, match="ml/a"):
        plan(Request(version="2.2", src="/c"), busy)
    assert plan(Request(version="2.2", src="/c", force=True), busy).changed
    assert plan(Request(version="2.1"), busy).steps == []
    with pytest.raises(backend.DriverInUseError):
        plan(Request(state="absent"), busy)


def test_absent_and_errors():
    assert plan(Request(state="absent"), seen(loaded=None, pkg=None)).steps == []
    assert plan(Request(state="absent"), seen()).steps == ["unload", "remove"]
    with pytest.raises(backend.DriverError, match="no src"):
        plan(Request(version="2.2"), seen())
    with pytest.raises(backend.DriverError, match="latest"):
        plan(Request(state="latest", version="2.2"), seen())
    with pytest.raises(backend.DriverError, match="state latest: no driver package"):
        plan(Request(state="latest", src="/c"), seen())


def test_switching_kind_removes_the_old_install_first():
    run_pkg = Package("/c/metax-driver-2.2-x86_64.run", "run", "2.2")
    result = plan(Request(version="2.2", src="/c"), seen(packages=[run_pkg]))
    assert result.steps == ["unload", "remove", "install", "load"]


versions = st.sampled_from(["2.1", "2.2", "2.10"])


@given(loaded=st.one_of(st.none(), versions), pkg=st.one_of(st.none(), versions),
       avail=st.sets(versions, min_size=1), state=st.sampled_from(["present", "latest", "absent"]),
       want=st.one_of(st.none(), versions))
def test_applying_a_plan_reaches_a_fixed_point(loaded, pkg, avail, state, want):
    """After the steps a plan lists, planning again finds nothing to do (IfNotPresent)."""
    packages = [Package("/c/metax-driver_%s_amd64.deb" % v, "deb", v) for v in sorted(avail)]
    request = Request(state=state, version=want if state != "latest" else None, src="/c")
    before = seen(loaded=loaded, pkg=pkg, packages=packages)
    try:
        first = plan(request, before)
    except backend.DriverError:
        return          # refused: nothing was done, nothing to check
    disk, running = pkg, loaded
    for step in first.steps:
        if step == "unload":
            running = None
        elif step == "remove":
            disk = None
        elif step == "install":
            disk = first.package.version
        elif step == "load":
            running = disk
    assert plan(request, seen(loaded=running, pkg=disk, packages=packages)).steps == []
    if state != "absent":
        assert running == (first.to_version or running)


# -- a payload's own version and the kernel driver it declares; the prebuilt layout ---------------------------
VENDOR = Package("/c/metax-driver-2.29.0.13-x86_64.run", "run", "2.29.0.13", driver_version="2.12.13")
TREE = Package("/c/image", "prebuilt", "2.29.0.13", driver_version="2.12.13", kernels=("5.15.0-105-generic",))


@pytest.mark.parametrize("have,want,match", [
    ("2.12.13", "2.12.13", True), ("2.12.13", "2.29.0.13", False),      # never the payload's own number
    ("2.12.13.4", "2.12.13", True), ("2.12", "2.12.13", True),          # as far as both say (labels: 3 parts)
    ("2.12.14", "2.12.13", False), (None, "2.12.13", False), ("2.12.13", None, False), ("", "", False)])
def test_driver_matches_is_the_one_on_target_comparison(have, want, match):
    assert package.driver_matches(have, want) is match


def test_declarations_parse_like_os_release_and_refuse_what_is_not_a_version():
    found = package.parse_declaration("# MetaX\nversion=2.29.0.13\ndriver = \"2.12.13\"\n\n")
    assert (found.version, found.driver, found.driver_version) == ("2.29.0.13", "2.12.13", "2.12.13")
    assert package.parse_declaration("version=2.40.1").driver_version == "2.40.1"     # no driver: the same
    for bad in ("driver=2.12.13", "version=latest", "version=2.29.0.13\ndriver=2.x", "version 2.29"):
        with pytest.raises(package.DriverPackageError):
            package.parse_declaration(bad)
    text = package.format_declaration("2.29.0.13", "2.12.13")
    assert package.parse_declaration(text) == package.Declaration("2.29.0.13", "2.12.13")
    assert package.is_declaration("metax-driver.version", "metax-driver")
    assert package.is_declaration("/d/metax-driver-2.29.0.13.version", "metax-driver")
    assert not package.is_declaration("metax-driverx.version", "metax-driver")
    assert not package.is_declaration("metax-driver_2.1_amd64.deb", "metax-driver")


def test_declarations_beside_packages_name_the_kernel_driver_of_their_version_only():
    found = package.candidates(["/d/metax-driver-2.29.0.13-x86_64.run", "/d/metax-driver_2.14.6_amd64.deb"],
                               "metax-driver", {"2.29.0.13": "2.12.13"})
    assert [(p.version, p.driver) for p in found] == [("2.14.6", "2.14.6"), ("2.29.0.13", "2.12.13")]


def test_a_prebuilt_tree_is_chosen_only_for_its_kernels_after_the_nodes_own_kind_before_run():
    deb = Package("/c/metax-driver_2.29.0.13_amd64.deb", "deb", "2.29.0.13", driver_version="2.12.13")
    kernel = "5.15.0-105-generic"
    assert package.choose([VENDOR, TREE, deb], "deb", "2.29.0.13", kernel) is deb
    assert package.choose([VENDOR, TREE, deb], "rpm", "2.29.0.13", kernel) is TREE
    assert package.choose([VENDOR, TREE], None, None, "6.1.0-other") is VENDOR
    assert package.choose([TREE], "deb", None, "6.1.0-other") is None
    assert package.choose([TREE], "deb", None, None) is None            # kernel unknown: never a guess
    with pytest.raises(package.DriverPackageError, match="lib/modules"):
        package.prebuilt("/c/empty", package.Declaration("2.29.0.13", "2.12.13"), [])


def vendor_seen(loaded="2.12.13", pkg="2.29.0.13", declared="2.12.13", packages=(), kind="run"):
    return Observed(node_kind="deb", loaded_version=loaded, package_version=pkg, package_kind=kind if pkg else None,
                    mxcd=True, packages=list(packages), package_driver=declared, kernel="5.15.0-105-generic")


def test_the_plan_compares_the_loaded_module_with_the_declared_driver_not_the_payload_version():
    # installed and loaded as declared: nothing to do, with or without the package at hand
    at_rest = plan(Request(version="2.29.0.13"), vendor_seen())
    assert at_rest.steps == [] and at_rest.to_driver == "2.12.13"
    assert plan(Request(), vendor_seen()).steps == []
    assert plan(Request(version="2.29.0.13", src="/c"), vendor_seen(declared=None, packages=[VENDOR])).steps == []
    # another module loaded than the installed payload declares: reload
    stale = plan(Request(version="2.29.0.13"), vendor_seen(loaded="2.12.11"))
    assert stale.steps == ["unload", "load"] and stale.to_driver == "2.12.13"
    # an upgrade to a vendor payload says both numbers
    up = plan(Request(version="2.29.0.13", src="/c"), vendor_seen(loaded="2.14.6", pkg="2.14.6", declared=None,
                                                                  kind="deb", packages=[TREE]))
    assert up.steps == ["unload", "remove", "install", "load"] and up.package is TREE
    assert (up.from_version, up.to_version, up.from_driver, up.to_driver) == ("2.14.6", "2.29.0.13", "2.14.6",
                                                                              "2.12.13")
    assert "kernel driver 2.12.13" in up.reason
    # deploy_policy Never accepts the vendor payload it was asked for by its declared module
    never = plan(Request(version="2.29.0.13", deploy_policy="Never"), vendor_seen(pkg=None, declared=None,
                                                                                  packages=[VENDOR]))
    assert never.steps == [] and never.to_driver == "2.12.13"
    # a prebuilt tree replaced by the next one: its files go first
    again = plan(Request(version="2.30.0.1", src="/c"), vendor_seen(kind="prebuilt", packages=[
        Package("/c/next", "prebuilt", "2.30.0.1", "2.13.0", ("5.15.0-105-generic",))]))
    assert again.steps == ["unload", "remove", "install", "load"] and again.to_driver == "2.13.0"
