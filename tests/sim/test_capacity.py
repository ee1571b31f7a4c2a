"""Device memory of the simulated GPU: capacity, context overhead, sharing between processes."""

import signal

import pytest

from tests.sim.conftest import SimEnv
from tests.sim.workload_runner import CONTEXT_OVERHEAD, GiB, MiB, holding, succeed, workload

SMALL = "count=2,memory=4GiB"


def test_allocation_past_the_device_fails(sim_env: SimEnv) -> None:
    # 4 GiB device, 512 MiB context: 3 GiB fits, 4 GiB cannot.
    fits = succeed(sim_env(SMALL), "--alloc", "3GiB", "--kernels", "0")
    assert fits["total_bytes"] == 4 * GiB
    assert fits["free_bytes"] == 4 * GiB - CONTEXT_OVERHEAD - 3 * GiB
    report = workload(sim_env(SMALL), "--alloc", "4GiB", "--kernels", "0")
    assert report["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
    assert report["returncode"] == 1


def test_capacity_boundary_is_exact(sim_env: SimEnv) -> None:
    node = sim_env("memory=4GiB,overhead=1GiB")
    exact = succeed(node, "--alloc", "3GiB", "--kernels", "0")
    assert exact["free_bytes"] == 0
    over = workload(node, "--alloc", str(3 * GiB + 1), "--kernels", "0")
    assert over["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"


def test_context_overhead_is_charged_once_per_process(sim_env: SimEnv) -> None:
    free = succeed(sim_env(SMALL), "--kernels", "0")["free_bytes"]
    assert free == 4 * GiB - CONTEXT_OVERHEAD
    # More streams, events and a graph in the same context cost no more device memory.
    busy = succeed(sim_env(SMALL), "--kernels", "0", "--streams", "8", "--graph")
    assert busy["free_bytes"] == free


def test_memory_of_other_processes_counts(sim_env: SimEnv) -> None:
    node = sim_env(SMALL)
    with holding(node, "--alloc", "2GiB", "--kernels", "0"):
        second = succeed(node, "--kernels", "0")
        assert second["free_bytes"] == 4 * GiB - 2 * CONTEXT_OVERHEAD - 2 * GiB
        # 4 GiB - 2 contexts - 2 GiB leaves 1 GiB.
        refused = workload(node, "--alloc", "1.5GiB", "--kernels", "0")
        assert refused["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
        other_device = succeed(sim_env(SMALL), "--device", "1", "--alloc", "3GiB", "--kernels", "0")
        assert other_device["free_bytes"] == 4 * GiB - CONTEXT_OVERHEAD - 3 * GiB
    # A process that ends normally gives its memory back (free_bytes is not checked: it
    # would count the refused process's context, see test_memory_of_a_dead_process_...).
    assert succeed(node, "--alloc", "3GiB", "--kernels", "0")["allocated_bytes"] == 3 * GiB


def test_sigterm_ends_the_hold_and_the_memory_is_freed(sim_env: SimEnv) -> None:
    node = sim_env(SMALL)
    with holding(node, "--alloc", "3GiB", "--kernels", "0") as (holder, _):
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(timeout=30) == 0
        assert succeed(node, "--kernels", "0")["free_bytes"] == 4 * GiB - CONTEXT_OVERHEAD


def test_killed_process_gives_its_memory_back(sim_env: SimEnv) -> None:
    node = sim_env(SMALL)
    with holding(node, "--alloc", "3GiB", "--kernels", "0") as (holder, _):
        # The device is full: another process gets its context and nothing more.
        assert succeed(node, "--kernels", "0")["free_bytes"] == 0
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        assert holder.returncode == -signal.SIGKILL
        after = succeed(node, "--alloc", "3GiB", "--kernels", "0")
        assert after["free_bytes"] == 512 * MiB


@pytest.mark.parametrize("ending", ["exit after an error", "SIGKILL"])
def test_memory_of_a_dead_process_is_free_at_once(sim_env: SimEnv, ending: str) -> None:
    node = sim_env(SMALL)
    if ending == "SIGKILL":
        with holding(node, "--alloc", "1GiB", "--kernels", "0") as (holder, _):
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=30)
    else:
        # After the failed allocation the workload exits at once, its context still open.
        failed = workload(node, "--alloc", "8GiB", "--kernels", "0")
        assert failed["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
    # A real driver frees a process's memory when it ends; cuMemGetInfo shows it at once.
    assert succeed(node, "--kernels", "0")["free_bytes"] == 4 * GiB - CONTEXT_OVERHEAD
