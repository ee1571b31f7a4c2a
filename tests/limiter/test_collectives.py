"""Collectives under a compute limit on the simulated GPU: a process that launches a collective's
kernel (NCCL's, known by its name) pauses only right before one, and the ranks of one pod pause
for one decision, taken by the first rank to reach the collective from the buckets of all the
GPUs that run collectives. The simulator's kernels do not wait for each other as NCCL's do, so
what these tests show is the rule (who pauses, for whose debt) and that each limit holds; the
effect on a real job is measured by benchmarks/multigpu_gpu.py."""

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from vgpu_limiter.region import open_region

from tests.limiter.conftest import WORKLOAD, LimitedEnv
from tests.limiter.test_compute_limits import TOLERANCE_PP

ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
KERNEL_US = 1000


def start(
    environment: dict[str, str], device: int, name: str, seconds: float, *options: str
) -> "Rank":
    return Rank(
        subprocess.Popen(
            [
                *(WORKLOAD, "--device", str(device), "--kernel-name", name),
                *("--duration", str(seconds), "--kernel-us", str(KERNEL_US), *options),
            ],
            env=environment | {"TF_LOG_LEVEL": "debug"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )


class Rank:
    """A workload process: its share of its GPU's time and what its limiter logged."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.share = 0.0
        self.log = ""

    def finish(self, timeout: float) -> "Rank":
        out, self.log = self.process.communicate(timeout=timeout)
        report = json.loads(out)
        assert report.get("error") is None, report
        self.share = 100 * float(report["achieved_kernels_per_s"]) * KERNEL_US / 1e6
        return self

    def paused_for_collectives(self) -> int:
        """Epochs the limiter ended to pause before a collective, by its pacing logs."""
        return sum(int(n) for n in re.findall(r"(\d+) for a collective", self.log))

    def collective_ends_per_s(self) -> float:
        """Epochs ended at a collective per second of the pacing logs' spans."""
        spans = sum(int(n) for n in re.findall(r"cap in (\d+) ms", self.log))
        return 1000 * self.paused_for_collectives() / spans if spans else 0.0


def limits(**by_gpu: int) -> dict[str, str]:
    """Compute limits by CUDA ordinal: limits(g0=50, g1=25)."""
    by_ordinal = {gpu.removeprefix("g"): percent for gpu, percent in by_gpu.items()}
    return {"TENSOR_FUSION_CUDA_UP_LIMIT": json.dumps(by_ordinal)}


@pytest.mark.parametrize("limit", [25, 50])
def test_a_rank_that_launches_collectives_keeps_its_limit(
    compute_env: LimitedEnv, limit: int
) -> None:
    rank = start(compute_env() | limits(g0=limit), 0, ALL_REDUCE, 3.0).finish(60)
    assert f"collective kernel {ALL_REDUCE}" in rank.log, rank.log
    assert rank.paused_for_collectives() > 0, rank.log
    assert rank.share == pytest.approx(limit, abs=TOLERANCE_PP)


@pytest.mark.parametrize("mode", ["capture", "build"])
def test_a_graph_with_a_collective_is_paced_as_one(compute_env: LimitedEnv, mode: str) -> None:
    """A collective captured into a CUDA graph (tensor-parallel inference servers replay their
    all-reduces so): the graph's launch pauses for the gang, as the kernel's would."""
    environment = compute_env() | limits(g0=30)
    rank = start(environment, 0, ALL_REDUCE, 2.0, f"--graph={mode}", "--batch", "4")
    rank.finish(60)
    assert f"collective kernel {ALL_REDUCE}" in rank.log, rank.log
    assert rank.paused_for_collectives() > 0, rank.log
    assert rank.share == pytest.approx(30, abs=TOLERANCE_PP)


def test_a_mangled_collective_name_is_known(compute_env: LimitedEnv) -> None:
    """cuFuncGetName gives C++ kernels' names mangled, as NCCL's are."""
    mangled = f"_Z{len(ALL_REDUCE)}{ALL_REDUCE}24ncclDevKernelArgsStorageILm4096EE"
    rank = start(compute_env() | limits(g0=30), 0, mangled, 2.0).finish(60)
    assert f"collective kernel {mangled}" in rank.log, rank.log
    assert rank.share == pytest.approx(30, abs=TOLERANCE_PP)


def test_the_ranks_of_a_pod_pause_for_the_deepest_debt(compute_env: LimitedEnv) -> None:
    """One pod, a rank on each GPU, 50 % on GPU 0 and 25 % on GPU 1: the rank on GPU 0 pauses
    for GPU 1's debt too (in a real job it would only spin in the collective meanwhile), and
    GPU 1's limit holds."""
    environment = compute_env() | limits(g0=50, g1=25)
    ranks = [start(environment, gpu, ALL_REDUCE, 4.0) for gpu in (0, 1)]
    fast, slow = (rank.finish(60) for rank in ranks)
    assert slow.share == pytest.approx(25, abs=TOLERANCE_PP), slow.log
    assert fast.share <= 25 + TOLERANCE_PP + 2, fast.log


def test_a_process_without_collectives_is_not_held_by_the_gang(compute_env: LimitedEnv) -> None:
    """Beside a rank on GPU 1, a plain program of the same pod on GPU 0 gets its own limit."""
    environment = compute_env() | limits(g0=50, g1=25)
    plain = start(environment, 0, "sleep_kernel", 3.0)
    rank = start(environment, 1, ALL_REDUCE, 3.0)
    plain.finish(60)
    rank.finish(60)
    assert "collective kernel" not in plain.log
    assert plain.share == pytest.approx(50, abs=TOLERANCE_PP), plain.log
    assert rank.share == pytest.approx(25, abs=TOLERANCE_PP), rank.log


def test_a_rank_killed_while_it_waited_for_its_lease_delays_the_others_once(
    compute_env: LimitedEnv,
) -> None:
    """A rank that gets its lease waits for the pod's other ranks that wait for theirs (their
    bits in the region's gang_waiting word), so that all start together. A rank killed while it
    waited leaves its bit set: the first start that waits the whole 5 ms for it clears it, and
    the next starts do not wait."""
    environment = compute_env() | limits(g0=50, g1=50)
    rank = start(environment, 0, ALL_REDUCE, 3.0)
    region_file = Path(environment["SHM_PATH"]) / "shm"
    deadline = time.monotonic() + 30
    while not region_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # running, its epochs paced
    with open_region(region_file) as region:
        region._live().gang_waiting = 1 << 1  # GPU 1's rank, gone while it waited
        rank.finish(60)
        left = int(region._live().gang_waiting)
    waited_us = sum(int(n) for n in re.findall(r"(\d+) us of it for the gang's other", rank.log))
    epochs = sum(int(n) for n in re.findall(r"pacing: (\d+) epochs", rank.log))
    assert left == 0, rank.log
    assert epochs >= 20, rank.log  # a bit never cleared would have cost 5 ms at each
    assert 4_000 <= waited_us < 40_000, rank.log
    assert rank.share == pytest.approx(50, abs=TOLERANCE_PP)


def test_collectives_launched_without_a_limit_are_counted_too(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """A limit set while a job runs: every rank has counted the job's collectives from its start
    (paced or not), so that its n-th is every other rank's n-th. Counted only from the limit on,
    ranks a few collectives apart would count differently for good and pause at different
    collectives."""
    rank = start(compute_env() | limits(g0=100), 0, ALL_REDUCE, 4.0)
    time.sleep(1.5)  # unlimited: its collectives run unpaced
    with open_region(tmp_path / "pod" / "shm") as region:
        region.set_limits(region.devices[0].uuid, compute_limit=5000)  # 50 %
    out, rank.log = rank.process.communicate(timeout=60)
    launched = json.loads(out)["kernels"]
    counted = [int(n) for n in re.findall(r"(\d+) collectives so far", rank.log)]
    assert counted, rank.log
    # 1.5 s at 100 %, then 2.5 s at 50 %: the limited part is under half of what it launched,
    # and the last report (a second after the one before) comes after a second at 50 %.
    assert 0.6 * launched < counted[-1] <= launched, (counted, launched)


def test_a_rank_ends_its_epoch_at_a_collective_once_a_pod_mate_lost_its_lease(
    compute_env: LimitedEnv,
) -> None:
    """When another pod takes a rank's lease, the pod's other ranks end their epochs that began
    before that (the region's gang_lost_ns) at their next collective, so that the other pod gets
    all their GPUs. Here the time is written every 2 ms, as if a pod-mate kept losing its
    lease: this rank's epochs end at a collective that often, where without it they run their
    quantum. A time in the future (a scribble, another boot's) is ignored."""
    environment = compute_env() | limits(g0=90)
    quiet = start(environment, 0, ALL_REDUCE, 2.0).finish(60)
    rank = start(environment, 0, ALL_REDUCE, 2.0)
    region_file = Path(environment["SHM_PATH"]) / "shm"
    deadline = time.monotonic() + 30
    while not region_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    with open_region(region_file) as region:
        while rank.process.poll() is None:
            region._live().gang_lost_ns = time.monotonic_ns()
            time.sleep(0.002)
        rank.finish(60)
    other = compute_env("scribbled") | limits(g0=90)  # a fresh pod: its bucket full again
    scribbled = start(other, 0, ALL_REDUCE, 2.0)
    other_region = Path(other["SHM_PATH"]) / "shm"
    while not other_region.exists() and time.monotonic() < deadline + 30:
        time.sleep(0.05)
    with open_region(other_region) as region:
        region._live().gang_lost_ns = time.monotonic_ns() + 600 * 10**9
        scribbled.finish(60)
    quiet_rate = max(quiet.collective_ends_per_s(), 10.0)
    assert rank.collective_ends_per_s() >= 2.5 * quiet_rate, (quiet.log, rank.log)
    assert scribbled.collective_ends_per_s() < 2 * quiet_rate, scribbled.log
    assert scribbled.share == pytest.approx(90, abs=TOLERANCE_PP)


def test_a_job_started_right_after_another_in_its_pod_is_paced_from_its_start(
    compute_env: LimitedEnv,
) -> None:
    """The gang's gate still holds the first job's last decision (about its collective n, a
    moment ago) when the second job's rank starts counting from 1. Taken before this process
    started, it is another job's: the new rank decides afresh. Counted against, it made the
    rank n collectives behind, and it ran unpaced until the gate went stale (2 s): 99.8 % of
    the GPU charged in its first logged second at a 90 % limit, nothing paused."""
    environment = compute_env() | limits(g0=90)
    start(environment, 0, ALL_REDUCE, 2.0).finish(60)
    second = start(environment, 0, ALL_REDUCE, 2.0).finish(60)
    charged = sum(int(n) for n in re.findall(r"(\d+) us of GPU time charged", second.log))
    paused = sum(int(n) for n in re.findall(r"(\d+) us paused for the limit", second.log))
    spans = sum(int(n) for n in re.findall(r"cap in (\d+) ms", second.log))
    assert spans > 0, second.log
    assert paused > 0, second.log
    assert charged / (10 * spans) == pytest.approx(90, abs=4), second.log
