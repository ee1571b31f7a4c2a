"""Running programs under libcuda_limiter.so on a fresh simulated node with a fresh pod."""

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from vgpu_limiter import library_path, sim

from tests.support.cuda_table import INCLUDE

Run = Callable[..., subprocess.CompletedProcess[str]]
LimitedEnv = Callable[..., dict[str, str]]

# The sanitize session runs these tests against a library built with ASan and UBSan: it names
# that build and the sanitizer runtime, which must be loaded before it.
LIMITER = os.environ.get("VGPU_TEST_LIMITER") or str(library_path())
PRELOAD = " ".join(filter(None, (os.environ.get("VGPU_TEST_PRELOAD_FIRST"), LIMITER)))
WORKLOAD = str(sim.workload_path())
C_TESTS = Path(__file__).parents[1] / "c"


def build_program(name: str, folder: Path) -> Path:
    """Compile tests/c/NAME.c against the simulated driver (our own CUDA declarations)."""
    program = folder / name
    sim_lib = Path(WORKLOAD).parents[1] / "lib"
    subprocess.run(
        [
            *("cc", "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}"),
            str(C_TESTS / f"{name}.c"),
            *("-o", str(program), f"-L{sim_lib}", "-l:libcuda.so.1", "-lpthread"),
        ],
        check=True,
    )
    return program


def build_unit_test(
    name: str, sources: Sequence[Path], includes: Sequence[Path], folder: Path
) -> Path:
    """Compile tests/c/NAME.c together with the limiter sources it tests, with the project's
    flags and no driver at all (the sanitize session builds the same under ASan and UBSan)."""
    program = folder / name
    subprocess.run(
        [
            *("cc", "-std=c11", "-Wall", "-Wextra", "-Werror"),
            *(f"-I{include}" for include in includes),
            str(C_TESTS / f"{name}.c"),
            *map(str, sources),
            *("-o", str(program)),
        ],
        check=True,
    )
    return program


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
            environment["LD_PRELOAD"] = PRELOAD
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


@pytest.fixture
def compute_env(limited_env: LimitedEnv, tmp_path: Path) -> LimitedEnv:
    """limited_env with this test's own device leases (node-wide files), one pod folder per
    name."""

    def make(pod: str = "pod", **extra: str) -> dict[str, str]:
        return limited_env(
            SHM_BASE_PATH=str(tmp_path / "base"), SHM_PATH=str(tmp_path / pod), **extra
        )

    return make
