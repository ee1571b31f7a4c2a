"""The committed gRPC stubs are what the vendored kubelet protos generate (the device plugin's
and the DRA driver's, scripts/generate_device_plugin_stubs.py), and the protos are the
kubelet's: the services it dials are there under their full names."""

import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_committed_stubs_match_the_protos() -> None:
    pytest.importorskip("grpc_tools")
    spec = importlib.util.spec_from_file_location(
        "generate_stubs", ROOT / "scripts" / "generate_device_plugin_stubs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["generate_stubs"] = module
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as scratch:
        stubs = module.generate(Path(scratch))
    assert set(stubs) == {
        proto.parent / f"{proto.stem}{suffix}"
        for proto in module.PROTOS
        for suffix in module.SUFFIXES
    }
    for path, text in stubs.items():
        assert (module.SOURCE_ROOT / path).read_text() == text, f"{path} is stale: nox -s protos"


def test_the_services_are_the_kubelets() -> None:
    from vgpu_hypervisor.device_plugin.podresources import api_pb2 as podresources
    from vgpu_hypervisor.device_plugin.proto import api_pb2 as deviceplugin
    from vgpu_hypervisor.dra.proto import dra_v1_pb2, dra_v1beta1_pb2, registration_pb2

    # The kubelet dials these full names: a package renamed by the vendoring would break it.
    services = {
        deviceplugin: ("DevicePlugin", "v1beta1.DevicePlugin"),
        podresources: ("PodResourcesLister", "v1.PodResourcesLister"),
        dra_v1_pb2: ("DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"),
        dra_v1beta1_pb2: ("DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"),
        registration_pb2: ("Registration", "pluginregistration.Registration"),
    }
    for module, (name, full_name) in services.items():
        assert module.DESCRIPTOR.services_by_name[name].full_name == full_name
    assert "share_id" in dra_v1_pb2.Device.DESCRIPTOR.fields_by_name


def test_the_methods_are_the_kubelets() -> None:
    """Every gRPC method path either side dials (/<package>.<Service>/<Method>), with its
    streaming, as kubernetes/kubelet's generated Go code names them: the device plugin's both
    services (the kubelet's Registration and the plugin's DevicePlugin), PodResources, plugin
    registration and the DRA node service of both versions."""
    from vgpu_hypervisor.device_plugin.podresources import api_pb2 as podresources
    from vgpu_hypervisor.device_plugin.proto import api_pb2 as deviceplugin
    from vgpu_hypervisor.dra.proto import dra_v1_pb2, dra_v1beta1_pb2, registration_pb2

    dra = ("NodePrepareResources", "NodeUnprepareResources")
    expected = {
        "/v1beta1.Registration/Register": "unary",
        **{
            f"/v1beta1.DevicePlugin/{method}": "unary"
            for method in (
                "GetDevicePluginOptions",
                "GetPreferredAllocation",
                "Allocate",
                "PreStartContainer",
            )
        },
        "/v1beta1.DevicePlugin/ListAndWatch": "server streaming",
        **{
            f"/v1.PodResourcesLister/{method}": "unary"
            for method in ("List", "GetAllocatableResources", "Get")
        },
        "/pluginregistration.Registration/GetInfo": "unary",
        "/pluginregistration.Registration/NotifyRegistrationStatus": "unary",
        **{f"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{m}": "unary" for m in dra},
        **{f"/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/{m}": "unary" for m in dra},
    }
    found = {}
    for module in (deviceplugin, podresources, registration_pb2, dra_v1_pb2, dra_v1beta1_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                assert not method.client_streaming, method.full_name
                kind = "server streaming" if method.server_streaming else "unary"
                found[f"/{service.full_name}/{method.name}"] = kind
    assert found == expected
