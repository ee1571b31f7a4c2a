"""Running programs under libcuda_limiter.so on a fresh simulated node with a fresh pod."""

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from vgpu_limiter import library_path, sim

Run = Callable[..., subprocess.CompletedProcess[str]]
LimitedEnv = Callable[..., dict[str, str]]

LIMITER = str(library_path())
WORKLOAD = str(sim.workload_path())


@pytest.fixture
def pod_folder(tmp_path: Path) -> Path:
    return tmp_path / "pod"


@pytest.fixture
def limited_env(tmp_path: Path, pod_folder: Path) -> LimitedEnv:
    """limited_env(memory='{"0":"4GiB"}', **extra) → an environment on the simulated GPU with the
    limiter preloaded, the pod at pod_folder, and a 512 MiB context overhead (the simulator's)."""

    def make(memory: str | None = None, preload: bool = True, **extra: str) -> dict[str, str]:
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("VGPU_SIM_", "TF_", "TENSOR_FUSION_", "CUDA_", "POD_", "SHM_"))
        }
        environment = base | sim.environment(state=tmp_path / "node.state", base=base)
        environment |= {"SHM_PATH": str(pod_folder), "TF_CUDA_CONTEXT_OVERHEAD": "512MiB"}
        if preload:
            environment["LD_PRELOAD"] = LIMITER
        if memory is not None:
            environment["TENSOR_FUSION_CUDA_MEM_LIMIT"] = memory
        return environment | extra

    return make


def run(
    command: Sequence[str], environment: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command), env=environment, capture_output=True, text=True, timeout=timeout, check=False
    )
