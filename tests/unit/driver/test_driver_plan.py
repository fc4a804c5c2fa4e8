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
