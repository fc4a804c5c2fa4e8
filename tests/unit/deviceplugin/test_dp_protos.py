# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The kubelet API protos: committed stubs match the .proto files, and the wire contract holds."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import tempfile

import pytest

pytest.importorskip("grpc")

from google.protobuf import descriptor_pb2  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin import constants as C  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.api import (  # noqa: E402
    deviceplugin_v1beta1_pb2 as dp, dra_health_v1alpha1_pb2 as drahealth, dra_v1_pb2 as dra, pluginregistration_v1_pb2 as reg,
    podresources_v1_pb2 as pr,
)
from ansible_collections.metax.gpu.plugins.module_utils.names import RESOURCE_NAME  # noqa: E402

API_DIR = os.path.join(os.path.dirname(os.path.abspath(dp.__file__)))

# (message, field) -> (number, label, type) as the kubelet has them: the wire contract.
T_STRING, T_BOOL, T_INT32, T_INT64, T_UINT64, T_MSG = 9, 8, 5, 3, 4, 11
REPEATED, OPTIONAL = 3, 1
DEVICEPLUGIN_FIELDS = {
    ("DevicePluginOptions", "pre_start_required"): (1, OPTIONAL, T_BOOL),
    ("DevicePluginOptions", "get_preferred_allocation_available"): (2, OPTIONAL, T_BOOL),
    ("RegisterRequest", "version"): (1, OPTIONAL, T_STRING),
    ("RegisterRequest", "endpoint"): (2, OPTIONAL, T_STRING),
    ("RegisterRequest", "resource_name"): (3, OPTIONAL, T_STRING),
    ("RegisterRequest", "options"): (4, OPTIONAL, T_MSG),
    ("ListAndWatchResponse", "devices"): (1, REPEATED, T_MSG),
    ("TopologyInfo", "nodes"): (1, REPEATED, T_MSG),
    ("NUMANode", "ID"): (1, OPTIONAL, T_INT64),
    ("Device", "ID"): (1, OPTIONAL, T_STRING),
    ("Device", "health"): (2, OPTIONAL, T_STRING),
    ("Device", "topology"): (3, OPTIONAL, T_MSG),
    ("PreStartContainerRequest", "devices_ids"): (1, REPEATED, T_STRING),
    ("PreferredAllocationRequest", "container_requests"): (1, REPEATED, T_MSG),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs"): (1, REPEATED, T_STRING),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs"): (2, REPEATED, T_STRING),
    ("ContainerPreferredAllocationRequest", "allocation_size"): (3, OPTIONAL, T_INT32),
    ("PreferredAllocationResponse", "container_responses"): (1, REPEATED, T_MSG),
    ("ContainerPreferredAllocationResponse", "deviceIDs"): (1, REPEATED, T_STRING),
    ("AllocateRequest", "container_requests"): (1, REPEATED, T_MSG),
    ("ContainerAllocateRequest", "devices_ids"): (1, REPEATED, T_STRING),
    ("CDIDevice", "name"): (1, OPTIONAL, T_STRING),
    ("AllocateResponse", "container_responses"): (1, REPEATED, T_MSG),
    ("ContainerAllocateResponse", "envs"): (1, REPEATED, T_MSG),
    ("ContainerAllocateResponse", "mounts"): (2, REPEATED, T_MSG),
    ("ContainerAllocateResponse", "devices"): (3, REPEATED, T_MSG),
    ("ContainerAllocateResponse", "annotations"): (4, REPEATED, T_MSG),
    ("ContainerAllocateResponse", "cdi_devices"): (5, REPEATED, T_MSG),
    ("Mount", "container_path"): (1, OPTIONAL, T_STRING),
    ("Mount", "host_path"): (2, OPTIONAL, T_STRING),
    ("Mount", "read_only"): (3, OPTIONAL, T_BOOL),
    ("DeviceSpec", "container_path"): (1, OPTIONAL, T_STRING),
    ("DeviceSpec", "host_path"): (2, OPTIONAL, T_STRING),
    ("DeviceSpec", "permissions"): (3, OPTIONAL, T_STRING),
}
PODRESOURCES_FIELDS = {
    ("ListPodResourcesResponse", "pod_resources"): (1, REPEATED, T_MSG),
    ("PodResources", "name"): (1, OPTIONAL, T_STRING),
    ("PodResources", "namespace"): (2, OPTIONAL, T_STRING),
    ("PodResources", "containers"): (3, REPEATED, T_MSG),
    ("ContainerResources", "name"): (1, OPTIONAL, T_STRING),
    ("ContainerResources", "devices"): (2, REPEATED, T_MSG),
    ("ContainerResources", "cpu_ids"): (3, REPEATED, T_INT64),
    ("ContainerResources", "memory"): (4, REPEATED, T_MSG),
    ("ContainerResources", "dynamic_resources"): (5, REPEATED, T_MSG),
    ("ContainerDevices", "resource_name"): (1, OPTIONAL, T_STRING),
    ("ContainerDevices", "device_ids"): (2, REPEATED, T_STRING),
    ("ContainerDevices", "topology"): (3, OPTIONAL, T_MSG),
    ("AllocatableResourcesResponse", "devices"): (1, REPEATED, T_MSG),
    ("AllocatableResourcesResponse", "cpu_ids"): (2, REPEATED, T_INT64),
    ("AllocatableResourcesResponse", "memory"): (3, REPEATED, T_MSG),
    ("ContainerMemory", "memory_type"): (1, OPTIONAL, T_STRING),
    ("ContainerMemory", "size"): (2, OPTIONAL, T_UINT64),
    ("GetPodResourcesRequest", "pod_name"): (1, OPTIONAL, T_STRING),
    ("GetPodResourcesRequest", "pod_namespace"): (2, OPTIONAL, T_STRING),
    ("GetPodResourcesResponse", "pod_resources"): (1, OPTIONAL, T_MSG),
}


def _fields(module):
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto, {(m.name, f.name): (f.number, f.label, f.type) for m in proto.message_type for f in m.field}


DRA_FIELDS = {
    ("NodePrepareResourcesRequest", "claims"): (1, REPEATED, T_MSG),
    ("NodePrepareResourcesResponse", "claims"): (1, REPEATED, T_MSG),      # map<string, ...>
    ("NodePrepareResourceResponse", "devices"): (1, REPEATED, T_MSG),
    ("NodePrepareResourceResponse", "error"): (2, OPTIONAL, T_STRING),
    ("Device", "request_names"): (1, REPEATED, T_STRING),
    ("Device", "pool_name"): (2, OPTIONAL, T_STRING),
    ("Device", "device_name"): (3, OPTIONAL, T_STRING),
    ("Device", "cdi_device_ids"): (4, REPEATED, T_STRING),
    ("Device", "share_id"): (5, OPTIONAL, T_STRING),
    ("NodeUnprepareResourcesRequest", "claims"): (1, REPEATED, T_MSG),
    ("NodeUnprepareResourcesResponse", "claims"): (1, REPEATED, T_MSG),
    ("NodeUnprepareResourceResponse", "error"): (1, OPTIONAL, T_STRING),
    ("Claim", "namespace"): (1, OPTIONAL, T_STRING),
    ("Claim", "uid"): (2, OPTIONAL, T_STRING),
    ("Claim", "name"): (3, OPTIONAL, T_STRING),
}
T_ENUM = 14
DRA_HEALTH_FIELDS = {
    ("DeviceIdentifier", "pool_name"): (1, OPTIONAL, T_STRING),
    ("DeviceIdentifier", "device_name"): (2, OPTIONAL, T_STRING),
    ("DeviceHealth", "device"): (1, OPTIONAL, T_MSG),
    ("DeviceHealth", "health"): (2, OPTIONAL, T_ENUM),
    ("DeviceHealth", "last_updated_time"): (3, OPTIONAL, T_INT64),
    ("DeviceHealth", "health_check_timeout_seconds"): (4, OPTIONAL, T_INT64),
    ("DeviceHealth", "message"): (5, OPTIONAL, T_STRING),
    ("NodeWatchResourcesResponse", "devices"): (1, REPEATED, T_MSG),
}
REGISTRATION_FIELDS = {
    ("PluginInfo", "type"): (1, OPTIONAL, T_STRING),
    ("PluginInfo", "name"): (2, OPTIONAL, T_STRING),
    ("PluginInfo", "endpoint"): (3, OPTIONAL, T_STRING),
    ("PluginInfo", "supported_versions"): (4, REPEATED, T_STRING),
    ("RegistrationStatus", "plugin_registered"): (1, OPTIONAL, T_BOOL),
    ("RegistrationStatus", "error"): (2, OPTIONAL, T_STRING),
}


@pytest.mark.parametrize("module, package, expected", [
    (dp, "v1beta1", DEVICEPLUGIN_FIELDS), (pr, "v1", PODRESOURCES_FIELDS),
    (dra, "k8s.io.kubelet.pkg.apis.dra.v1", DRA_FIELDS), (reg, "pluginregistration", REGISTRATION_FIELDS),
    (drahealth, "v1alpha1", DRA_HEALTH_FIELDS)])
def test_wire_contract(module, package, expected):
    proto, fields = _fields(module)
    assert proto.package == package
    for key, value in expected.items():
        assert fields.get(key) == value, key


def test_method_paths():
    """gRPC method paths are /<package>.<Service>/<Method>: what the kubelet dials and serves."""
    services = {s.full_name: [m.name for m in s.methods] for s in dp.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": ["GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation",
                                 "Allocate", "PreStartContainer"],
    }
    law = dp.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"]
    assert law.output_type.full_name == "v1beta1.ListAndWatchResponse"
    lister = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.name for m in lister.methods] == ["List", "GetAllocatableResources", "Get"]
    # the paths the kubelet's DRA client and plugin watcher dial (api_grpc.pb.go of v1.36.3)
    assert {s.full_name: [m.name for m in s.methods] for s in dra.DESCRIPTOR.services_by_name.values()} == {
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": ["NodePrepareResources", "NodeUnprepareResources"]}
    assert {s.full_name: [m.name for m in s.methods] for s in reg.DESCRIPTOR.services_by_name.values()} == {
        "pluginregistration.Registration": ["GetInfo", "NotifyRegistrationStatus"]}
    # KEP-4680's health stream the kubelet opens on the DRA socket (dra-health/v1alpha1 of v1.36.3)
    health = drahealth.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert [m.name for m in health.methods] == ["NodeWatchResources"]
    watch = health.methods_by_name["NodeWatchResources"]
    assert watch.full_name == "v1alpha1.DRAResourceHealth.NodeWatchResources"
    assert watch.server_streaming and not watch.client_streaming
    assert {v.name: v.number for v in drahealth.DESCRIPTOR.enum_types_by_name["HealthStatus"].values} == {
        "UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_known_bytes():
    """A Register request encodes to the bytes a Go peer produces for the same values."""
    request = dp.RegisterRequest(version="v1beta1", endpoint="m.sock", resource_name="a.b/c",
                                 options=dp.DevicePluginOptions(get_preferred_allocation_available=True))
    assert request.SerializeToString() == (
        b"\n\x07v1beta1" b"\x12\x06m.sock" b"\x1a\x05a.b/c" b"\"\x02\x10\x01")


def _normalized(fdp):
    """Drop what CopyToProto does not carry (json_name), so both sides compare."""
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(fdp)

    def strip(messages):
        for msg in messages:
            for field in msg.field:
                field.ClearField("json_name")
            strip(msg.nested_type)
    strip(out.message_type)
    return out


def test_committed_stubs_match_the_protos():
    """The committed *_pb2.py describe exactly what the .proto files say (regenerate otherwise)."""
    grpc_tools = pytest.importorskip("grpc_tools")
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as out:
        names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(API_DIR, "*.proto")))
        assert names == ["deviceplugin_v1beta1.proto", "dra_health_v1alpha1.proto", "dra_v1.proto",
                         "pluginregistration_v1.proto", "podresources_v1.proto"]
        args = ["protoc", "--proto_path=" + API_DIR, "--descriptor_set_out=" + os.path.join(out, "set.pb")]
        assert protoc.main(args + [os.path.join(API_DIR, n) for n in names]) == 0, grpc_tools
        fds = descriptor_pb2.FileDescriptorSet()
        with open(os.path.join(out, "set.pb"), "rb") as handle:
            fds.ParseFromString(handle.read())
    fresh = {f.name: _normalized(f) for f in fds.file}
    for module in (dp, pr, dra, reg, drahealth):
        committed = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(committed)
        assert _normalized(committed) == fresh[committed.name], (
            "%s is out of date: run plugins/module_utils/deviceplugin/gen_protos.sh" % committed.name)


def test_gen_protos_check_mode():
    """gen_protos.sh --check passes: the committed files are exactly the generator's output."""
    pytest.importorskip("grpc_tools")
    import sys
    script = os.path.join(API_DIR, "..", "gen_protos.sh")
    assert os.access(script, os.X_OK)
    result = subprocess.run([script, "--check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
                            env=dict(os.environ, PYTHON=sys.executable))
    assert result.returncode == 0, result.stdout.decode()


def test_gen_protos_reports_stale_files(tmp_path):
    pytest.importorskip("grpc_tools")
    from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin import gen_protos

    for name in os.listdir(API_DIR):
        if name.endswith(".proto"):
            with open(os.path.join(API_DIR, name)) as src, open(str(tmp_path / name), "w") as dst:
                dst.write(src.read())
    assert gen_protos.main(["--dir", str(tmp_path), "--check"]) == 1
    assert gen_protos.main(["--dir", str(tmp_path)]) == 0
    assert gen_protos.main(["--dir", str(tmp_path), "--check"]) == 0
    assert sorted(n for n in os.listdir(str(tmp_path)) if n.endswith(".py")) == [
        "deviceplugin_v1beta1_pb2.py", "deviceplugin_v1beta1_pb2_grpc.py",
        "dra_health_v1alpha1_pb2.py", "dra_health_v1alpha1_pb2_grpc.py", "dra_v1_pb2.py", "dra_v1_pb2_grpc.py",
        "pluginregistration_v1_pb2.py", "pluginregistration_v1_pb2_grpc.py",
        "podresources_v1_pb2.py", "podresources_v1_pb2_grpc.py"]
    for name in os.listdir(str(tmp_path)):
        if name.endswith(".py"):
            with open(str(tmp_path / name)) as handle:
                text = handle.read()
            assert text.startswith("# -*- coding: utf-8 -*-\n# Copyright: metax.gpu contributors\n")
            assert max(len(line) for line in text.splitlines()) <= 160


def _upstream(path):
    roots = [os.environ.get("GOMODCACHE", ""), os.path.expanduser("~/.cache/metax-gpu/go/mod"),
             os.path.expanduser("~/go/pkg/mod")]
    for root in roots:
        hits = sorted(glob.glob(os.path.join(root, "k8s.io", "kubelet@v*", path))) if root else []
        if hits:
            return hits[-1]
    return None


@pytest.mark.parametrize("module, rel", [
    (dp, "pkg/apis/deviceplugin/v1beta1/api.proto"), (pr, "pkg/apis/podresources/v1/api.proto"),
    (dra, "pkg/apis/dra/v1/api.proto"), (reg, "pkg/apis/pluginregistration/v1/api.proto"),
    (drahealth, "pkg/apis/dra-health/v1alpha1/api.proto")])
def test_same_as_the_kubelets_own_proto(module, rel):
    """When the Kubernetes sources are around (the local cluster builds them), compare field by field."""
    upstream = _upstream(rel)
    if upstream is None:
        pytest.skip("k8s.io/kubelet sources not in a Go module cache here")
    pytest.importorskip("grpc_tools")
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as out:
        src = os.path.join(out, "src")
        os.mkdir(src)
        with open(upstream) as handle:
            text = handle.read()
        if "gogo.proto" in text:
            pytest.skip("this kubelet version's proto imports gogoproto")
        with open(os.path.join(src, "upstream.proto"), "w") as handle:
            handle.write(text)
        assert protoc.main(["protoc", "--proto_path=" + src, "--descriptor_set_out=" + os.path.join(out, "u.pb"),
                            os.path.join(src, "upstream.proto")]) == 0
        fds = descriptor_pb2.FileDescriptorSet()
        with open(os.path.join(out, "u.pb"), "rb") as handle:
            fds.ParseFromString(handle.read())
    theirs = fds.file[0]
    ours = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(ours)
    assert ours.package == theirs.package

    def shape(fdp):
        msgs = {}
        for msg in fdp.message_type:
            msgs[msg.name] = sorted((f.number, f.name, f.label, f.type, f.type_name) for f in msg.field)
            for nested in msg.nested_type:
                msgs[msg.name + "." + nested.name] = sorted((f.number, f.name, f.type) for f in nested.field)
        svcs = {s.name: [(m.name, m.input_type, m.output_type, m.server_streaming) for m in s.method]
                for s in fdp.service}
        return msgs, svcs
    assert shape(ours) == shape(theirs)


def test_resource_name_is_one_the_kubelet_accepts():
    """The kubelet rejects Register with a resource name that is not an extended resource name.

    Mirrors v1helper.IsExtendedResourceName: a qualified name (DNS-1123 subdomain
    prefix, "/", a name of at most 63 characters) outside the kubernetes.io
    domains and not starting with "requests.".
    """
    prefix, slash, name = RESOURCE_NAME.partition("/")
    assert prefix and slash and name, RESOURCE_NAME
    assert len(prefix) <= 253 and re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", prefix)
    assert len(name) <= 63 and re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", name)
    assert not (prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"))
    assert not RESOURCE_NAME.startswith("requests.")
    # and it survives the wire unchanged
    request = dp.RegisterRequest(version=C.API_VERSION, endpoint="m.sock", resource_name=RESOURCE_NAME)
    assert dp.RegisterRequest.FromString(request.SerializeToString()).resource_name == RESOURCE_NAME
