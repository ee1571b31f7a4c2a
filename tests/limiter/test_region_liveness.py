"""Dead processes give their memory back, zombies included (issue 18 item 5), a pod whose
process slots are all taken says so (item 9), and a pod deleted under its workers keeps
charging them (item 4)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.daemon.pods import PodNotFound, PodStore
from vgpu_limiter import region as regions

from tests.limiter.conftest import WORKLOAD, LimitedEnv, run
from tests.limiter.test_compute_limits import SIM_GPU0
from tests.limiter.test_region import GiB, claim, raw, start_time


def _state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rfind(")") + 2]


def _zombie_worker(environment: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    """A worker holding 3 GiB, SIGKILLed, whose parent (a sleeping shell) never waits."""
    parent = subprocess.Popen(
        ["sh", "-c", f'"{WORKLOAD}" --kernels 1 --alloc 3GiB --hold 60 & echo $!; exec sleep 60'],
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    report = json.loads(parent.stdout.readline())  # printed once it holds the memory
    assert report.get("error") is None, report
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _state(worker) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state(worker) == "Z"
    return parent, worker


def test_a_killed_worker_whose_parent_has_not_waited_is_reclaimed(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    environment = limited_env('{"0": "4GiB"}')
    parent, worker = _zombie_worker(environment)
    try:
        # By the daemon side...
        with regions.open_region(pod_folder / "shm") as region:
            assert [p.pid for p in region.processes] == [worker]
            assert not regions.pid_alive(worker, region.processes[0].start_time)
            assert [p.pid for p in region.reap()] == [worker]
            assert region.devices[0].memory_used == 0
        # ...and by the limiter of the pod's next process, which finds the room it needs.
        parent.kill()
        parent.wait()
        parent, worker = _zombie_worker(environment)
        again = run([WORKLOAD, "--kernels", "1", "--alloc", "3GiB"], environment)
        assert json.loads(again.stdout).get("error") is None, again.stderr
    finally:
        parent.kill()
        parent.wait()


def test_the_1025th_process_hears_that_the_slots_are_full(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    path = pod_folder / "shm"
    regions.create_region(path, "default", "pod").close()
    me, own = os.getpid(), regions.own_pid_namespace()
    with raw(path) as pointer:
        for slot in range(regions.MAX_PROCESSES):  # all alive: this very process
            claim(pointer, slot, me, [], namespace=own, start=start_time(me))
    environment = limited_env('{"0": "4GiB"}', TF_CUDA_CONTEXT_OVERHEAD="0")
    result = run([WORKLOAD, "--kernels", "1", "--alloc", "1GiB"], environment)
    assert json.loads(result.stdout)["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
    assert "the pod's 1024 process slots are all in use" in result.stderr, result.stderr
    assert "does not fit" not in result.stderr


# A pod deleted with force while its workers live (issue 18 item 4, in part)


def _holding(environment: dict[str, str], size: str) -> subprocess.Popen[str]:
    worker = subprocess.Popen(
        [WORKLOAD, "--kernels", "1", "--alloc", size, "--hold", "60"],
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    report = json.loads(worker.stdout.readline())
    assert report.get("error") is None, report
    return worker


def test_force_delete_and_create_again_cannot_double_a_pods_memory(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    store = PodStore(tmp_path / "base")
    pod = Path(regions.region_path(store.base, "default", "train")).parent
    environment = limited_env(SHM_PATH=str(pod))
    limits = {SIM_GPU0: GpuLimits(memory=4 * GiB)}
    store.create("default", "train", limits)
    old = _holding(environment, "3GiB")  # 3.5 GiB with its context
    try:
        store.delete("default", "train", force=True)
        with pytest.raises(PodNotFound):
            store.get("default", "train")
        assert store.scan() == []
        # Created again: the same file, its usage included, one limit for old and new workers.
        again = store.create("default", "train", limits)
        assert again.devices[0].memory_used == 3 * GiB + GiB // 2
        new = run([WORKLOAD, "--kernels", "1", "--alloc", "1GiB"], environment)
        assert json.loads(new.stdout)["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
        # Deleted again; once its last worker is gone, a scan removes it.
        store.delete("default", "train", force=True)
        old.kill()
        old.wait()
        assert store.scan() == []
        assert not pod.exists()
    finally:
        old.kill()
        old.wait()
        store.close()
