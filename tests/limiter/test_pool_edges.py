"""Stream-ordered allocation and physical memory at the edges on the simulated node: any number
of pools, a pool destroyed with live allocations, pools and streams of another device than the
current context's, and GPUs outside a confined pod (tests/c/limiter_pool_edges.c)."""

from pathlib import Path

import pytest
from vgpu_limiter.region import create_region

from tests.limiter.conftest import LimitedEnv, build_program, run

GiB = 1 << 30
GPU0 = "GPU-5157a1e0-0000-4000-8000-000000000001"


def passes(program: Path, case: str, environment: dict[str, str]) -> None:
    result = run([str(program), case], environment)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith(" passed, 0 failed"), result.stdout


@pytest.mark.parametrize("case", ["many", "destroy"])
def test_pools_on_the_current_device(limited_env: LimitedEnv, tmp_path: Path, case: str) -> None:
    program = build_program("limiter_pool_edges", tmp_path)
    passes(program, case, limited_env('{"0": "4GiB"}'))


@pytest.mark.parametrize("case", ["device", "default"])
def test_pool_memory_is_charged_to_the_pools_device(
    limited_env: LimitedEnv, tmp_path: Path, case: str
) -> None:
    """``default``: before, a device's default pool first used from another device's stream
    was charged to the stream's device."""
    program = build_program("limiter_pool_edges", tmp_path)
    passes(program, case, limited_env('{"0": "8GiB", "1": "4GiB"}'))


def test_no_physical_memory_or_pool_on_a_gpu_outside_the_pod(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    program = build_program("limiter_pool_edges", tmp_path)
    base = tmp_path / "base"
    create_region(base / "default" / "train" / "shm", "default", "train", {GPU0: (4 * GiB, 0)})
    environment = limited_env(SHM_BASE_PATH=str(base), POD_NAME="train", CUDA_VISIBLE_DEVICES="0,1")
    environment.pop("SHM_PATH")
    passes(program, "outside", environment)
