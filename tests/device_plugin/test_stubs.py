"""The committed gRPC stubs are what the vendored kubelet protos generate."""

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
    with tempfile.TemporaryDirectory() as scratch:
        stubs = module.generate(Path(scratch))
    assert set(stubs) == {proto.parent / name for proto in module.PROTOS for name in module.OUTPUTS}
    for path, text in stubs.items():
        assert (module.SOURCE_ROOT / path).read_text() == text, f"{path} is stale: nox -s protos"
