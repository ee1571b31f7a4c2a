"""Each other system's own README example, its environment as documented (GPU UUIDs replaced by
the simulated node's), run under libcuda_limiter.so on the simulated GPU: the limits hold."""

import json
from pathlib import Path

from vgpu_limiter.region import open_region

from tests.limiter.conftest import WORKLOAD, LimitedEnv, run

GiB = 1 << 30
MiB = 1 << 20
GPU0 = "GPU-5157a1e0-0000-4000-8000-000000000001"  # the simulated node's device 0
GPU1 = "GPU-5157a1e0-0000-4000-8000-000000000002"
CONTEXT = 512 * MiB  # the simulator's context overhead, which the fixture charges


def workload(environment: dict[str, str], *options: str) -> dict[str, object]:
    result = run([WORKLOAD, "--kernels", "1", *options], environment)
    report: dict[str, object] = json.loads(result.stdout)
    report["stderr"] = result.stderr
    return report


def compute_limits(pod_folder: Path) -> dict[str, int]:
    """Each GPU's compute limit in the pod's region, which the compute limiter enforces."""
    with open_region(pod_folder / "shm", writable=False) as region:
        return {device.uuid: device.compute_limit for device in region.devices}


def assert_memory_limit(environment: dict[str, str], device: int, limit: int) -> None:
    """The program sees `limit` as the device's memory, may fill it, and not one byte more."""
    seen = workload(environment, "--device", str(device))
    assert seen.get("total_bytes") == limit, seen
    fits = workload(environment, "--device", str(device), "--alloc", str(limit - CONTEXT))
    assert fits.get("error") is None, fits
    over = workload(environment, "--device", str(device), "--alloc", str(limit - CONTEXT + 1))
    assert over["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"


def test_vgpu_manager_pod_example(limited_env: LimitedEnv, pod_folder: Path) -> None:
    # vgpu-manager's README pod: one GPU, 1000m on devices 0 and 1, half the cores.
    environment = limited_env(
        VGPU_POD_NAME="gpu-test",
        VGPU_POD_NAMESPACE="default",
        VGPU_POD_UID="0b9f2c7e-1d7a-4f7e-9a51-3c0c3f2d8e11",
        VGPU_CONTAINER_NAME="test",
        LOGGER_LEVEL="4",
        CUDA_MEM_LIMIT_0="1000m",
        CUDA_MEM_LIMIT_1="1000m",
        CUDA_CORE_LIMIT="50",
        GPU_DEVICES_UUID=GPU0,
        NVIDIA_VISIBLE_DEVICES=GPU0,
        CUDA_VISIBLE_DEVICES=GPU0,
    )
    # Ours and theirs for the same setting must agree: this spec names the container once.
    environment.pop("CONTAINER_NAME", None)
    assert_memory_limit(environment, 0, 1000 * MiB)
    assert compute_limits(pod_folder)[GPU0] == 5000


def test_vgpu_manager_docker_example(limited_env: LimitedEnv, pod_folder: Path) -> None:
    # vgpu-manager's README docker run: three GPUs by UUID (two on this node), 1000m each.
    environment = limited_env(
        LOGGER_LEVEL="5",
        CUDA_MEM_LIMIT_0="1000m",
        CUDA_MEM_LIMIT_1="1000m",
        CUDA_MEM_LIMIT_2="1000m",
        POD_NAME="test",
        GPU_DEVICES_UUID=f"{GPU0},{GPU1}",
        NVIDIA_VISIBLE_DEVICES=f"{GPU0},{GPU1}",
    )
    assert_memory_limit(environment, 0, 1000 * MiB)
    assert_memory_limit(environment, 1, 1000 * MiB)


def test_vgpu_manager_oversold_ratio(limited_env: LimitedEnv) -> None:
    # CUDA_MEM_RATIO: the device keeps 1/ratio of CUDA_MEM_LIMIT; the rest is host-backed.
    environment = limited_env(CUDA_MEM_LIMIT_0="4g", CUDA_MEM_RATIO_0="2")
    assert workload(environment)["total_bytes"] == 2 * GiB


def test_vcuda_hook_example(limited_env: LimitedEnv) -> None:
    # vcuda-hook's README: VCUDA_LOG_LEVEL=debug, VCUDA_MEMORY_LIMIT of 10G for every device.
    environment = limited_env(VCUDA_LOG_LEVEL="debug", VCUDA_MEMORY_LIMIT=str(10 * GiB))
    assert_memory_limit(environment, 0, 10 * GiB)
    assert workload(environment, "--device", "1")["total_bytes"] == 10 * GiB


def test_hami_core_example(limited_env: LimitedEnv, pod_folder: Path) -> None:
    # HAMi-core's README: 1 GiB and 50 % SM for every device.
    environment = limited_env(CUDA_DEVICE_MEMORY_LIMIT="1g", CUDA_DEVICE_SM_LIMIT="50")
    assert_memory_limit(environment, 0, GiB)
    assert compute_limits(pod_folder)[GPU0] == 5000


def test_hami_core_shared_cache_is_the_pods_folder(limited_env: LimitedEnv, tmp_path: Path) -> None:
    cache = tmp_path / "vgpu" / "abc.cache"
    environment = limited_env(
        CUDA_DEVICE_MEMORY_LIMIT="1g", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cache)
    )
    del environment["SHM_PATH"]
    assert_memory_limit(environment, 0, GiB)
    assert (cache / "shm").is_file()


def test_vgpu_rs_examples(limited_env: LimitedEnv, pod_folder: Path, tmp_path: Path) -> None:
    # vgpu.rs's README: by UUID (lower case "gpu-"), then by index.
    by_uuid = limited_env(
        f'{{"{GPU0.lower()}": 1073741824}}',
        TENSOR_FUSION_CUDA_UP_LIMIT=f'{{"{GPU0.lower()}": 10}}',
    )
    assert_memory_limit(by_uuid, 0, GiB)
    assert compute_limits(pod_folder)[GPU0] == 1000
    by_index = limited_env(
        '{"0": 2147483648}',
        TENSOR_FUSION_CUDA_UP_LIMIT='{"0": 20}',
        SHM_PATH=str(tmp_path / "other-pod"),
    )
    assert_memory_limit(by_index, 0, 2 * GiB)
    assert compute_limits(tmp_path / "other-pod")[GPU0] == 2000
