"""The committed gRPC stubs are what the vendored api.proto generates."""

import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_the_proto() -> None:
    pytest.importorskip("grpc_tools")
    spec = importlib.util.spec_from_file_location(
        "generate_stubs", ROOT / "scripts" / "generate_device_plugin_stubs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["generate_stubs"] = module
    spec.loader.exec_module(module)
    target = module.SOURCE_ROOT / module.PROTO.parent
    with tempfile.TemporaryDirectory() as scratch:
        stubs = module.generate(Path(scratch))
    assert set(stubs) == set(module.OUTPUTS)
    for name, text in stubs.items():
        assert (target / name).read_text() == text, f"{name} is stale: nox -s protos"
