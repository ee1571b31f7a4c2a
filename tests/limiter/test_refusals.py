"""The region counts the allocations the limit refuses (for the daemon's reports): every refused
call path counts once with its size, what fits counts nothing, and an allocation that a pod with
oversubscription serves from host memory is not a refusal."""

import json
import os
import sys
from pathlib import Path

import pytest
from vgpu_limiter import region as regions

from tests.limiter.conftest import WORKLOAD, LimitedEnv, run
from tests.limiter.test_oversubscription import OUT_OF_MEMORY, PROGRAM, UUID, make_pod, steps

GiB = 1 << 30
MiB = 1 << 20
TF_LIMITER = str(Path(sys.executable).with_name("tf-limiter"))


def workload(environment: dict[str, str], *options: str) -> dict[str, object]:
    result = run([WORKLOAD, "--kernels", "1", *options], environment)
    report: dict[str, object] = json.loads(result.stdout)
    return report


def counted(pod_folder: Path) -> tuple[int, int]:
    with regions.open_region(pod_folder / "shm", writable=False) as pod:
        device = pod.device(UUID)
        return device.refusals, device.refused_bytes_last


@pytest.mark.parametrize("path", ["linked", "dlopen", "procaddress"])
def test_a_refused_allocation_is_counted_with_its_size(
    limited_env: LimitedEnv, pod_folder: Path, path: str
) -> None:
    environment = limited_env('{"0": "4GiB"}')
    fits = workload(environment, "--path", path, "--alloc", str(4 * GiB - 512 * MiB))
    assert fits.get("error") is None, fits
    assert counted(pod_folder) == (0, 0)
    over = workload(environment, "--path", path, "--alloc", str(4 * GiB - 512 * MiB + 1))
    assert over["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
    # The charge is what the device would hold: whole 2 MiB pages.
    assert counted(pod_folder) == (1, 4 * GiB - 510 * MiB)
    workload(environment, "--path", path, "--alloc", str(5 * GiB))
    assert counted(pod_folder) == (2, 5 * GiB)
    command = [TF_LIMITER, "inspect", "--path", str(pod_folder / "shm"), "--json"]
    inspect = run(command, dict(os.environ))
    assert inspect.returncode == 0, inspect.stderr
    (device,) = [d for d in json.loads(inspect.stdout)["devices"] if d["uuid"] == UUID]
    assert (device["refusals"], device["refused_bytes_last"]) == (2, 5 * GiB)


def test_every_refused_kind_of_allocation_counts_once(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    make_pod(pod_folder, oversubscribe=False)
    environment = limited_env(TF_CUDA_CONTEXT_OVERHEAD="256MiB")
    kinds = ["alloc", "managed", "pitch", "legacy", "pool", "vmm", "array"]
    results = steps(environment, pod_folder, *(f"{kind}:{kind}=1024" for kind in kinds))
    assert [result["code"] for result in results] == [OUT_OF_MEMORY] * len(kinds)
    refusals, last = counted(pod_folder)
    assert refusals == len(kinds)
    assert last >= GiB


def test_host_backed_memory_past_the_limit_is_not_a_refusal(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    make_pod(pod_folder, oversubscribe=True)
    environment = limited_env(TF_CUDA_CONTEXT_OVERHEAD="256MiB")
    fits, spilled = steps(environment, pod_folder, "alloc:a=512", "alloc:b=512")
    assert (fits["code"], spilled["code"], spilled["host"]) == (0, 0, 512 * MiB)
    assert counted(pod_folder) == (0, 0)
    # A path with no host-backed form is refused at the limit as before, and counted.
    (refused,) = steps(environment, pod_folder, "vmm:c=1024")
    assert refused["code"] == OUT_OF_MEMORY
    assert counted(pod_folder) == (1, GiB)


def test_a_refused_allocation_says_so_on_stderr_once_in_a_while(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    """Before, the program got a plain out-of-memory error and nothing said a limit refused it
    (under a 1 GiB limit a 512 MiB allocation fails: the context's charge comes first)."""
    environment = limited_env('{"0": "1GiB"}', POD_NAMESPACE="team", POD_NAME="notebook")
    result = run([WORKLOAD, "--kernels", "1", "--alloc", "600MiB"], environment)
    assert json.loads(result.stdout)["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
    (said,) = [line for line in result.stderr.splitlines() if "refused" in line]
    assert said.startswith("vgpu-limiter[") and ": warning: " in said
    assert "600 MiB refused: pod team/notebook holds 512 MiB of its 1 GiB limit" in said, said
    assert "each CUDA context counts at least 512 MiB" in said
    assert "TF_LOG_LEVEL=error silences this" in said
    # Several refusals in one process: said once (at most one line every 10 s per process).
    make_pod(pod_folder / "many", oversubscribe=False)
    many = run(
        [sys.executable, "-c", PROGRAM, str(pod_folder / "many" / "shm")]
        + [f"alloc:a{n}=1024" for n in range(4)],
        limited_env(SHM_PATH=str(pod_folder / "many"), TF_CUDA_CONTEXT_OVERHEAD="256MiB"),
    )
    assert many.returncode == 0, many.stderr
    assert [json.loads(line)["code"] for line in many.stdout.splitlines()] == [OUT_OF_MEMORY] * 4
    assert sum("refused" in line for line in many.stderr.splitlines()) == 1, many.stderr
    quiet = run(
        [WORKLOAD, "--kernels", "1", "--alloc", "600MiB"], environment | {"TF_LOG_LEVEL": "error"}
    )
    assert "refused" not in quiet.stderr
