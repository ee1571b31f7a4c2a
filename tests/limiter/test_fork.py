"""Forks of a CUDA program under the limiter on the simulated GPU: a data loader's workers, a
pool or a shell forked while other threads launch, allocate or retain contexts. A child is
another process: it starts its own accounting and pacing, never hangs on a lock a thread of its
parent held at the fork, and never charges the pod for its parent's work."""

import json
from pathlib import Path

import pytest
from vgpu_limiter.lease_broker import LeaseBroker
from vgpu_limiter.region import open_region

from tests.limiter.conftest import LimitedEnv, build_program, run
from tests.limiter.test_compute_limits import SIM_GPU0

MS = 1_000_000


# The forks per mode: the pool's lock is held only between driver calls, and the simulator takes
# its driver's lock for a fork, so few forks find it held.
@pytest.mark.parametrize(
    ("mode", "forks"), [("launch", 10), ("pool", 60), ("primary", 10), ("limit", 10)]
)
def test_a_child_forked_while_a_thread_holds_a_lock_of_the_limiter_goes_on(
    compute_env: LimitedEnv, tmp_path: Path, mode: str, forks: int
) -> None:
    """A thread launches paced 50 ms kernels (holding its device's pacing lock while it waits for
    the previous one), allocates from a pool, retains the primary context or sets a context's
    limit over and over, while the main thread forks children that make the calls a worker or a
    runtime's exit handlers may make. Each child finishes; none waits for ever on a lock its
    parent's thread held when it was forked."""
    program = build_program("limiter_fork", tmp_path)
    environment = compute_env(
        TENSOR_FUSION_CUDA_MEM_LIMIT='{"0": "8GiB"}', TENSOR_FUSION_CUDA_UP_LIMIT='{"0": 90}'
    )
    result = run([str(program), "busy", mode, str(forks)], environment, timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"forked": forks, "hung": ""}, result.stderr


def test_children_of_a_parent_the_daemon_paces_take_the_gpu_in_turn(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """The launching thread's lease is the daemon's arbiter's: a child forked while the thread
    holds the GPU (or waits for its kernels) connects to the arbiter on its own for its launch,
    gets the GPU in turn, and finishes."""
    program = build_program("limiter_fork", tmp_path)
    environment = compute_env(TENSOR_FUSION_CUDA_UP_LIMIT='{"0": 90}')
    leases = LeaseBroker(Path(environment["SHM_BASE_PATH"]), [SIM_GPU0])
    leases.start()
    try:
        result = run([str(program), "busy", "launch", "10"], environment, timeout=600)
    finally:
        leases.close()
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"forked": 10, "hung": ""}, result.stderr


def test_a_child_never_charges_its_parents_epoch(compute_env: LimitedEnv, tmp_path: Path) -> None:
    """The parent's epoch of 20 ms of kernels is open when it forks; the child releases the
    primary context it inherited (as a runtime's exit handler does) and exits. The pod is
    charged the parent's 21 ms once, not the epoch a second time by the child."""
    program = build_program("limiter_fork", tmp_path)
    environment = compute_env(TENSOR_FUSION_CUDA_UP_LIMIT='{"0": 50}')
    result = run([str(program), "charge"], environment, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"child": 0}
    with open_region(tmp_path / "pod" / "shm") as region:
        charged = region.devices[0].gpu_ns
    assert 18 * MS <= charged <= 30 * MS, charged / MS


def test_a_child_waits_for_the_writers_lock_its_parent_holds(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    """flock belongs to the open file description, which fork shares: a child that took the
    region's writers' lock on the descriptor it inherited was let in while its parent was
    inside the writers' section, and its unlock let go of the parent's lock, for every other
    process of the pod and the daemon. A child has a description of its own: it waits until the
    parent lets go, and the parent's lock holds meanwhile."""
    program = build_program("limiter_fork", tmp_path)
    result = run([str(program), "writers"], limited_env('{"0": "4GiB"}'))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"child": 0, "entered": False, "kept": True}, result.stderr


def test_a_process_killed_in_the_writers_section_leaves_no_lock_to_its_children(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    """A process forks a worker that lives on, then is killed while it holds the writers' lock.
    The kernel lets go of the lock with the dead process: the worker, which inherited the
    region's descriptor, does not keep it held for the pod's other processes (which waited for
    it, in cuInit, for as long as the worker lived) and the daemon."""
    program = build_program("limiter_fork", tmp_path)
    result = run([str(program), "orphan"], limited_env('{"0": "4GiB"}'))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"held": False}, result.stderr


def test_a_program_a_limited_process_runs_has_no_region_open(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    """A program run from a process that has the pod's region open (fork and exec) does not
    inherit it (O_CLOEXEC): a shell or a tool that is no CUDA program holds no descriptor of the
    pod's region, and no lock with it."""
    program = build_program("limiter_fork", tmp_path)
    result = run([str(program), "exec"], limited_env('{"0": "4GiB"}'))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"open": False}, result.stderr
