"""The committed DRA stubs are what the vendored kubelet protos generate, and the protos are
the kubelet's: the services and versions the kubelet calls are there."""

import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_the_protos() -> None:
    pytest.importorskip("grpc_tools")
    spec = importlib.util.spec_from_file_location(
        "generate_dra_stubs", ROOT / "scripts" / "generate_dra_stubs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["generate_dra_stubs"] = module
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as scratch:
        stubs = module.generate(Path(scratch))
    assert len(stubs) == 4 * len(module.PROTOS)
    for name, text in stubs.items():
        assert (module.target() / name).read_text() == text, f"{name} is stale: nox -s protos"


def test_the_services_are_the_kubelets() -> None:
    from vgpu_hypervisor.dra.proto import dra_v1_pb2, dra_v1beta1_pb2, registration_pb2

    # The kubelet dials these full names: a package renamed by the vendoring would break it.
    assert dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    )
    assert dra_v1beta1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    )
    assert registration_pb2.DESCRIPTOR.services_by_name["Registration"].full_name == (
        "pluginregistration.Registration"
    )
    assert "share_id" in dra_v1_pb2.Device.DESCRIPTOR.fields_by_name
