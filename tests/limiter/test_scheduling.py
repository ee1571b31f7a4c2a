"""Scheduling between pods on the simulated GPU (issue 13): shares under contention, burst to the
soft limit while the GPU is uncontended, the region's GPU/throttled/burst time, and freeze/resume.
The simulator's kernels take exactly their stated time; bounds allow for a loaded 2-core machine,
where a descheduled launching thread leaves the GPU idle now and then."""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from vgpu_limiter.lease import DeviceLease, lease_path
from vgpu_limiter.region import DeviceLimits, create_region, ffi, open_region

from tests.limiter.conftest import WORKLOAD, LimitedEnv, build_program
from tests.limiter.test_compute_limits import SIM_GPU0, concurrent, limit

KERNEL_US = 500


def workload(environment: dict[str, str], seconds: float, *options: str) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [WORKLOAD, "--duration", str(seconds), "--kernel-us", str(KERNEL_US), "--marks", *options],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def report(process: "subprocess.Popen[str]") -> dict[str, object]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    result: dict[str, object] = json.loads(out)
    return result


def share_between(marks: list[list[float]], start: float, end: float) -> float:
    """Percent of the GPU's time the program's finished kernels took from start to end (s)."""
    done_at = [kernels for seconds, kernels in marks if seconds <= start]
    done_by = [kernels for seconds, kernels in marks if seconds <= end]
    first = done_at[-1] if done_at else 0
    last = done_by[-1] if done_by else 0
    return 100 * (last - first) * KERNEL_US * 1e-6 / (end - start)


def test_three_pods_split_the_device_by_their_limits(compute_env: LimitedEnv) -> None:
    shares = concurrent(
        [limit(compute_env("a"), 20), limit(compute_env("b"), 30), limit(compute_env("c"), 50)]
    )
    for got, wanted in zip(shares, (20, 30, 50), strict=True):
        assert got == pytest.approx(wanted, abs=4), shares


def test_effective_limits_divide_an_oversubscribed_device(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """Two pods at 60 % with the scheduler's effective limits of 60 and 40 (high against low):
    the limiter paces each at the smaller of its limit and the effective one."""
    for name, effective in (("a", 6000), ("b", 4000)):
        pod_with_burst(tmp_path / name, 60, 0)
        with open_region(tmp_path / name / "shm") as region:
            region.set_effective(0, effective)
    shares = concurrent([compute_env("a"), compute_env("b")], seconds=3.0)
    assert shares[0] == pytest.approx(60, abs=5), shares
    assert shares[1] == pytest.approx(40, abs=4), shares


def pod_with_burst(folder: Path, hard: int, soft: int) -> None:
    create_region(
        folder / "shm", "default", folder.name, {SIM_GPU0: DeviceLimits(0, hard * 100, soft * 100)}
    ).close()


def test_a_pod_bursts_while_alone_and_falls_back_when_another_wants_the_gpu(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    pod_with_burst(tmp_path / "a", 30, 100)
    bursting = workload(compute_env("a"), 4)
    time.sleep(2.0)
    other = workload(limit(compute_env("b"), 70), 2)
    first, second = report(bursting), report(other)
    marks = first["marks"]
    assert isinstance(marks, list)
    assert share_between(marks, 0.3, 1.8) >= 90  # alone: up to its soft limit
    # Within a second of the other pod's start the pair is back at its limits.
    assert share_between(marks, 2.6, 3.8) == pytest.approx(30, abs=4)
    rate = second["achieved_kernels_per_s"]
    assert isinstance(rate, float)
    other_share = 100 * rate * KERNEL_US * 1e-6
    assert other_share == pytest.approx(70, abs=6)
    with open_region(tmp_path / "a" / "shm") as region:
        device = region.devices[0]
    # The device words: its GPU time, the part above its hard limit, and its waits.
    ran = sum(kernels for _, kernels in marks[-1:]) * KERNEL_US * 1e-6
    assert device.gpu_ns / 1e9 == pytest.approx(ran, rel=0.1)
    assert device.burst_ns / 1e9 == pytest.approx(0.7 * 1.9, rel=0.25)
    assert device.throttled_ns / 1e9 > 0.5  # waited for its 30 % beside the other pod


def test_a_pod_of_two_processes_bursts_while_no_other_pod_wants_the_gpu(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """The pod's own processes take turns with the lease; that is no other pod wanting the GPU,
    so together they run up to the pod's soft limit (they share its bucket), not its hard one."""
    pod_with_burst(tmp_path / "a", 30, 100)
    processes = [workload(compute_env("a"), 2.5) for _ in range(2)]
    shares = [share_between(report(p)["marks"], 0.4, 2.3) for p in processes]  # type: ignore[arg-type]
    assert sum(shares) >= 85, shares
    with open_region(tmp_path / "a" / "shm") as region:
        assert region.devices[0].burst_ns > 0


def leak_a_waiter(base: Path) -> None:
    """The lease's waiters count as a waiter killed while it waited leaves it (no daemon)."""
    DeviceLease.open(base, SIM_GPU0).close()
    with lease_path(base, SIM_GPU0).open("r+b") as lease:
        lease.seek(ffi.offsetof("struct vgpu_device_lease", "waiters"))
        lease.write((1).to_bytes(8, "little"))


def test_a_waiter_killed_while_waiting_does_not_stop_burst(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """A process killed while it waited for the lease leaves its count in the lease's waiters.
    A count that no live waiter renews is no one waiting: a pod alone still bursts."""
    leak_a_waiter(tmp_path / "base")
    pod_with_burst(tmp_path / "a", 30, 100)
    marks = report(workload(compute_env("a"), 2))["marks"]
    assert isinstance(marks, list)
    assert share_between(marks, 0.3, 1.8) >= 90


def test_a_leaked_waiter_count_does_not_stop_a_pod_of_two_processes_bursting(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """Without a daemon nothing resets the lease's waiters: a count left by a waiter killed
    while it waited stays. A pod of two processes keeps the lease's word that someone waits
    fresh itself (one waits while the other holds), so the count beyond its own looked like
    another pod waiting, for good: 30 % instead of its soft limit. Only another pod's word
    that it waits counts now."""
    leak_a_waiter(tmp_path / "base")
    pod_with_burst(tmp_path / "a", 30, 100)
    processes = [workload(compute_env("a"), 2.5) for _ in range(2)]
    shares = [share_between(report(p)["marks"], 0.4, 2.3) for p in processes]  # type: ignore[arg-type]
    assert sum(shares) >= 85, shares


def test_a_pod_of_two_processes_falls_back_beside_another_pod_despite_a_leaked_count(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """The other side of the test above: another pod's waiters say so themselves, so the pod of
    two processes still sees them and keeps to its hard limit beside them."""
    leak_a_waiter(tmp_path / "base")
    pod_with_burst(tmp_path / "a", 30, 100)
    processes = [workload(compute_env("a"), 3) for _ in range(2)]
    other = workload(limit(compute_env("b"), 70), 3)
    shares = [share_between(report(p)["marks"], 0.5, 2.8) for p in processes]  # type: ignore[arg-type]
    other_share = share_between(report(other)["marks"], 0.5, 2.8)  # type: ignore[arg-type]
    # Not bursting (a loaded machine may leave either a little short of its limit).
    assert 20 <= sum(shares) <= 35, (shares, other_share)
    assert other_share >= 62, (shares, other_share)


def test_no_burst_without_a_soft_limit(compute_env: LimitedEnv, tmp_path: Path) -> None:
    pod_with_burst(tmp_path / "a", 30, 0)
    result = report(workload(compute_env("a"), 2))
    marks = result["marks"]
    assert isinstance(marks, list)
    assert share_between(marks, 0.2, 1.9) == pytest.approx(30, abs=3)
    with open_region(tmp_path / "a" / "shm") as region:
        assert region.devices[0].burst_ns == 0


def largest_gap(marks: list[list[float]]) -> tuple[float, float]:
    """(when, how long) of the longest time between two finished rounds."""
    gaps = [(marks[i][0], marks[i + 1][0] - marks[i][0]) for i in range(len(marks) - 1)]
    return max(gaps, key=lambda gap: gap[1])


def test_a_frozen_pod_runs_nothing_until_resumed(compute_env: LimitedEnv, tmp_path: Path) -> None:
    environment = limit(compute_env("a"), 50)
    process = workload(environment, 3, "--batch", "1")
    time.sleep(1.0)
    with open_region(tmp_path / "a" / "shm") as region:
        epoch = region.freeze_epoch
        region.freeze(30)
        assert region.frozen and region.freeze_epoch == epoch + 1
        time.sleep(1.0)
        region.resume()
        assert not region.frozen
    marks = report(process)["marks"]
    assert isinstance(marks, list)
    _, gap = largest_gap(marks)
    # Nothing finished for the freeze's second, less what was queued before it (≤ 10 ms backlog).
    assert 0.9 <= gap <= 1.5, gap
    kernels = marks[-1][1]
    assert 100 * kernels * KERNEL_US * 1e-6 / 2.0 == pytest.approx(50, abs=6)


def test_a_launch_waiting_for_its_budget_through_a_freeze_does_not_run(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """A pod at 5 % with 20-ms kernels waits about 0.4 s for its budget after each. Frozen just
    after one ends, its next launch waits through the freeze: before, only a launch's entry
    looked at the freeze, and that launch ran about 0.4 s after the freeze."""
    environment = limit(compute_env("a"), 5)
    process = workload(environment, 8, "--kernel-us", "20000", "--batch", "1")
    path = tmp_path / "a" / "shm"
    try:
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open_region(path) as region:

            def gpu_ns() -> int:
                devices = region.devices  # none until the process adds its GPU
                return devices[0].gpu_ns if devices else 0

            while gpu_ns() == 0 and time.monotonic() < deadline:
                time.sleep(0.002)
            start = gpu_ns()
            while gpu_ns() == start and time.monotonic() < deadline:
                time.sleep(0.002)  # an epoch just ended: the next launch waits for its budget
            region.freeze(30)
            frozen_at = time.monotonic()
            charged = gpu_ns()
            late = []
            while time.monotonic() - frozen_at < 1.2:
                now = gpu_ns()
                if now != charged:
                    late.append((round(time.monotonic() - frozen_at, 3), now - charged))
                    charged = now
                time.sleep(0.002)
            region.resume()
    finally:
        process.kill()
        process.communicate()
    # What was queued before the freeze is charged as the next launch closes the epoch, at
    # once; nothing that ran after it.
    assert all(seconds < 0.2 for seconds, _ in late), late


def test_a_freeze_of_one_gpu_holds_that_gpu_only(compute_env: LimitedEnv, tmp_path: Path) -> None:
    other_gpu = SIM_GPU0[:-1] + "2"
    folder = tmp_path / "a"
    limits = DeviceLimits(0, 5000)
    create_region(folder / "shm", "default", "a", {SIM_GPU0: limits, other_gpu: limits}).close()
    process = workload(compute_env("a"), 3, "--batch", "1")
    time.sleep(0.8)
    with open_region(folder / "shm") as region:
        region.freeze(30, uuid=other_gpu)  # not the GPU the program runs on
        assert region.frozen_gpus() == [other_gpu]
        time.sleep(0.6)
        region.freeze(30, uuid=SIM_GPU0)  # now its GPU too
        time.sleep(0.8)
        region.resume()
        assert region.frozen_gpus() == []
    marks = report(process)["marks"]
    assert isinstance(marks, list)
    when, gap = largest_gap(marks)
    assert 0.7 <= gap <= 1.3, (when, gap)
    assert when >= 1.3  # nothing stopped while only the other GPU was frozen


def test_a_freeze_the_daemon_stops_renewing_expires(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    process = workload(limit(compute_env("a"), 50), 3, "--batch", "1")
    time.sleep(0.8)
    with open_region(tmp_path / "a" / "shm") as region:
        region.freeze(0.5)
    out, err = process.communicate(timeout=60)
    marks = json.loads(out)["marks"]
    _, gap = largest_gap(marks)
    assert 0.4 <= gap <= 1.0, gap
    assert "freeze expired" in err


def test_freezing_threads_that_synchronize_each_other(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """Four threads launch while a fifth synchronizes the context and their streams: a freeze in
    the middle blocks the launches, deadlocks nothing, and all goes on after the resume."""
    program = build_program("limiter_threads", tmp_path)
    environment = compute_env("a") | {"TENSOR_FUSION_CUDA_UP_LIMIT": '{"0": 25}'}
    process = subprocess.Popen(
        [str(program), "4", "3", "200"], env=environment, stdout=subprocess.PIPE, text=True
    )
    time.sleep(1.0)
    with open_region(tmp_path / "a" / "shm") as region:
        region.freeze(30)
        time.sleep(0.8)
        region.resume()
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    result = json.loads(out)
    assert result["failures"] == 0
    # About 2.2 s of the 3 s ran, at 25 %.
    got = 100 * result["kernels"] * 200e-6 / result["seconds"]
    assert got == pytest.approx(25 * 2.2 / 3, abs=5)


def test_a_frozen_process_killed_gives_its_memory_back(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    environment = limit(compute_env("a"), 50) | {"TENSOR_FUSION_CUDA_MEM_LIMIT": '{"0": "4GiB"}'}
    process = subprocess.Popen(
        [WORKLOAD, "--duration", "30", "--kernel-us", "500", "--alloc", "3GiB"],
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
    )
    folder = tmp_path / "a"
    deadline = time.monotonic() + 20
    while not (folder / "shm").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    with open_region(folder / "shm") as region:
        while time.monotonic() < deadline and (
            not region.devices or region.devices[0].memory_used < 3 << 30
        ):
            time.sleep(0.05)
        region.freeze(30)
        time.sleep(0.3)  # its launches wait now; its memory stays
        assert region.devices[0].memory_used >= 3 << 30
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        assert [p.pid for p in region.reap()] == [process.pid]
        assert region.devices[0].memory_used == 0
        region.resume()


def test_contention_is_remembered_by_each_pod_alone_is_not(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """Two pods on one GPU each record in their region when they last saw the other want it (the
    pod's bucket then holds L of 50 ms, whichever of its processes refills it); a pod alone never
    does (its bucket holds L of 16 ms)."""
    concurrent([limit(compute_env("alone"), 30)], seconds=1.0)
    concurrent([limit(compute_env("a"), 30), limit(compute_env("b"), 30)], seconds=1.5)
    at = ffi.offsetof("struct vgpu_region", "devices")
    at += ffi.offsetof("struct vgpu_region_device", "contended_ns")  # of GPU 0's entry
    seen = {}
    for pod in ("alone", "a", "b"):
        data = (tmp_path / pod / "shm").read_bytes()
        seen[pod] = int.from_bytes(data[at : at + 8], "little")
    assert seen["alone"] == 0, seen
    assert seen["a"] > 0 and seen["b"] > 0, seen


def test_the_lease_adds_up_the_gpu_time_of_every_pods_epochs(
    compute_env: LimitedEnv, tmp_path: Path
) -> None:
    """The lease's busy_ns, from which the daemon bounds the boost, is the GPU time of every
    epoch on the GPU: without a daemon (no boost) what the pods were charged, together."""
    concurrent([limit(compute_env("a"), 20), limit(compute_env("b"), 30)], seconds=2.0)
    charged = 0
    for pod in ("a", "b"):
        with open_region(tmp_path / pod / "shm") as region:
            charged += region.devices[0].gpu_ns
    with DeviceLease.open(tmp_path / "base", SIM_GPU0) as lease:
        busy = lease.busy_ns()
    assert busy == charged
    assert busy / 1e9 == pytest.approx(0.5 * 2.0, rel=0.25)


def test_without_a_daemon_a_pod_under_its_limit_waits_little_beside_a_busy_one(
    compute_env: LimitedEnv,
) -> None:
    """Lease files, no daemon: a bursty pod (10 ms of work, then 40 ms idle, limit 50 %) beside a
    busy pod at 50 %: its waiting is marked urgent in the lease file and the holder ends its epoch
    at its next launch, so its rounds wait about one short drain, not the rest of a 32-ms
    epoch."""
    rounds = ("--batch", "10", "--kernel-us", "1000", "--idle-ms", "40")

    def bursty(seconds: float) -> "subprocess.Popen[str]":
        return subprocess.Popen(
            [WORKLOAD, "--duration", str(seconds), *rounds],
            env=limit(compute_env("infer"), 50),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    alone = report(bursty(2))
    busy = workload(limit(compute_env("train"), 50), 5)
    time.sleep(0.5)
    beside = report(bursty(4))
    trained = report(busy)
    print(f"alone p90 {alone['round_ms_p90']} ms, beside p50/p90 {beside['round_ms_p50']}/"
          f"{beside['round_ms_p90']} ms")  # fmt: skip
    assert float(str(beside["round_ms_p90"])) <= float(str(alone["round_ms_p90"])) + 8
    # The busy pod keeps its limit.
    assert 100 * float(str(trained["achieved_kernels_per_s"])) * KERNEL_US / 1e6 >= 45
