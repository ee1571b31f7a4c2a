"""Dead processes give their memory back, zombies included (issue 18 item 5), and a pod whose
process slots are all taken says so (item 9)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from vgpu_limiter import region as regions

from tests.limiter.conftest import WORKLOAD, LimitedEnv, run
from tests.limiter.test_region import claim, raw, start_time


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
