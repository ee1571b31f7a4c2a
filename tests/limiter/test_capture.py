"""Launches into a capturing stream are not paced, whichever entry point opened the capture:
the limiter asks the driver whether a stream captures only while a capture it counted is open
(capture.c), so a capture opened by an entry point it does not count would be paced."""

import json
from pathlib import Path

import pytest

from tests.limiter.conftest import LimitedEnv, build_program, run

FORMS = ["v1", "v1_ptsz", "v2", "v2_ptsz", "to_graph", "to_graph_ptsz"]


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_program("limiter_capture", tmp_path_factory.mktemp("capture"))


@pytest.mark.parametrize("path", ["linked", "procaddress"])
@pytest.mark.parametrize("form", FORMS)
def test_a_launch_into_a_capture_waits_for_nothing(
    compute_env: LimitedEnv, program: Path, form: str, path: str
) -> None:
    # At 2 % the 300 ms kernel before the capture leaves the pod's bucket seconds in debt: a
    # paced launch would wait them out.
    environment = compute_env() | {"TENSOR_FUSION_CUDA_UP_LIMIT": '{"0": 2}'}
    result = run([str(program), form, path], environment)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["end"], report["nodes"]) == (0, 1)
    assert report["captured_launch_ms"] < 2000
