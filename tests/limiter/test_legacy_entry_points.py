"""The deprecated entry points the driver still exports, on the simulated GPU: legacy launches
are paced as cuLaunchKernel, the v1 memory view is the pod's, v1 context destroys and primary
releases give back what their _v2 siblings do, green contexts are charged a context, and the
multi-device cooperative launch is refused on a GPU with a compute limit."""

import json
from pathlib import Path

import pytest

from tests.limiter.conftest import LimitedEnv, build_program, run

GiB = 1 << 30
UINT_MAX = (1 << 32) - 1
TOLERANCE_PP = 3.0
CUDA_ERROR_NOT_SUPPORTED = 801


@pytest.fixture
def program(tmp_path: Path) -> Path:
    return build_program("limiter_legacy", tmp_path)


@pytest.mark.parametrize("path", ["linked", "dlopen", "procaddress"])
def test_v1_views_destroys_releases_and_green_contexts(
    limited_env: LimitedEnv, program: Path, path: str
) -> None:
    environment = limited_env('{"0": "1GiB"}', TF_CUDA_CONTEXT_OVERHEAD="256MiB")
    result = run([str(program), "memory", path], environment)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("passed, 0 failed")


def view(environment: dict[str, str], program: Path) -> dict[str, int]:
    result = run([str(program), "view"], environment)
    assert result.returncode == 0, result.stderr
    report: dict[str, int] = json.loads(result.stdout)
    return report


def test_the_v1_view_is_the_pods_clamped_to_an_unsigned_int(
    limited_env: LimitedEnv, program: Path, tmp_path: Path
) -> None:
    small = view(limited_env('{"0": "3GiB"}'), program)
    assert small["total_v1"] == small["total_v2"] == small["device0_v1"] == 3 * GiB
    assert small["free_v1"] == small["free_v2"] == 3 * GiB - 512 * (1 << 20)
    assert small["device1_v1"] == UINT_MAX  # 80 GiB, no limit
    # A pod's region keeps its limits: each view is another pod's.
    big = view(limited_env('{"0": "6GiB"}', SHM_PATH=str(tmp_path / "big")), program)
    assert big["total_v2"] == big["device0_v2"] == 6 * GiB
    assert big["total_v1"] == big["free_v1"] == big["device0_v1"] == UINT_MAX
    unlimited = view(limited_env(SHM_PATH=str(tmp_path / "none")), program)
    assert unlimited["total_v2"] == 80 * GiB and unlimited["total_v1"] == UINT_MAX


def got_share(environment: dict[str, str], program: Path, form: str) -> float:
    result = run([str(program), "launch", form, "2", "1000"], environment, timeout=60)
    assert result.returncode == 0, result.stderr
    report: dict[str, float] = json.loads(result.stdout)
    return 100 * report["kernels"] * 1000e-6 / report["seconds"]


@pytest.mark.parametrize("form", ["launch", "grid", "gridasync"])
def test_legacy_launches_are_paced_as_cuLaunchKernel(
    limited_env: LimitedEnv, program: Path, tmp_path: Path, form: str
) -> None:
    def environment(pod: str, limit: int | None) -> dict[str, str]:
        extra = {"TENSOR_FUSION_CUDA_UP_LIMIT": json.dumps({"0": limit})} if limit else {}
        return limited_env(
            SHM_BASE_PATH=str(tmp_path / "base"), SHM_PATH=str(tmp_path / pod), **extra
        )

    assert got_share(environment("free", None), program, form) == pytest.approx(100, abs=2)
    paced = got_share(environment(form, 25), program, form)
    assert paced == pytest.approx(25, abs=TOLERANCE_PP)
    modern = got_share(environment("kernel", 25), program, "kernel")
    assert paced == pytest.approx(modern, abs=TOLERANCE_PP)


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        (None, 0),
        ('{"0": 100}', 0),
        ('{"0": 25}', CUDA_ERROR_NOT_SUPPORTED),
        ('{"1": 25}', CUDA_ERROR_NOT_SUPPORTED),  # found by the launch's stream, not current
    ],
)
def test_multi_device_cooperative_launch_is_refused_under_a_compute_limit(
    limited_env: LimitedEnv, program: Path, limits: str | None, expected: int
) -> None:
    extra = {"TENSOR_FUSION_CUDA_UP_LIMIT": limits} if limits else {}
    result = run([str(program), "multidevice"], limited_env(**extra))
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == expected
    if expected:
        assert "cuLaunchCooperativeKernelMultiDevice refused" in result.stderr
