"""Kernel timing of the simulated GPU: durations, streams, graphs and time sharing.

Every kernel occupies its whole device and kernels of all streams and processes run one after
another, so the expected times are sums of kernel durations.
"""

import pytest

from tests.sim.conftest import SimEnv
from tests.sim.workload_runner import TOLERANCE, Report, finish, start, succeed


def assert_takes(report: Report, seconds: float) -> None:
    """GPU time (events) and wall time both match `seconds`; neither may be early."""
    assert seconds * 0.999 <= report["gpu_time_s"] <= seconds * (1 + TOLERANCE), report
    assert seconds * 0.999 <= report["elapsed_s"] <= seconds * (1 + TOLERANCE), report


def test_hundred_kernels_of_ten_ms_take_one_second(sim_env: SimEnv) -> None:
    report = succeed(sim_env(), "--kernels", "100", "--kernel-us", "10000")
    assert report["kernels"] == 100
    assert_takes(report, 1.0)
    assert report["achieved_kernels_per_s"] == pytest.approx(100, rel=TOLERANCE)


@pytest.mark.parametrize("path", ["dlopen", "procaddress"])
def test_timing_is_the_same_on_every_path(sim_env: SimEnv, path: str) -> None:
    report = succeed(sim_env(), "--path", path, "--kernels", "40", "--kernel-us", "5000")
    assert_takes(report, 0.2)


def test_streams_do_not_overlap_kernels(sim_env: SimEnv) -> None:
    # Four streams, all joined into the end event: the kernels still run one at a time.
    report = succeed(
        sim_env(), "--streams", "4", "--batch", "3", "--kernels", "40", "--kernel-us", "5000"
    )
    assert_takes(report, 0.2)


@pytest.mark.parametrize("mode", ["capture", "build"])
def test_graph_launches_replay_every_kernel(sim_env: SimEnv, mode: str) -> None:
    # 5 launches of a graph of 8 kernels of 5 ms.
    report = succeed(
        sim_env(),
        *(f"--graph={mode}", "--kernels", "40", "--batch", "8", "--kernel-us", "5000"),
    )
    assert report["kernels"] == 40
    assert_takes(report, 0.2)


def test_duration_runs_for_the_wall_time_asked(sim_env: SimEnv) -> None:
    report = succeed(sim_env(), "--duration", "0.4", "--kernel-us", "2000", "--streams", "2")
    # The loop stops issuing at 0.4 s; at most 4 rounds of 10 kernels are still queued then.
    assert 0.4 <= report["elapsed_s"] <= (0.4 + 0.08) * (1 + TOLERANCE), report
    assert report["gpu_time_s"] == pytest.approx(report["kernels"] * 0.002, rel=TOLERANCE)
    assert report["achieved_kernels_per_s"] == pytest.approx(500, rel=TOLERANCE)


def test_two_processes_on_one_device_share_its_time(sim_env: SimEnv) -> None:
    # Alone each takes 0.5 s; together the device runs 1 s of kernels in all. Rounds of one
    # kernel interleave the two processes finely, so both finish near the end of that second.
    args = ("--kernels", "100", "--kernel-us", "5000", "--batch", "1")
    node = sim_env()
    first, second = start(node, *args), start(node, *args)
    reports = [finish(first), finish(second)]
    for report in reports:
        # Not below 1.6 times alone (would mean overlap), at most the whole second of work.
        assert 0.8 <= report["elapsed_s"] <= 1.0 * (1 + TOLERANCE), reports
        assert 0.8 <= report["gpu_time_s"] <= 1.0 * (1 + TOLERANCE), reports


def test_processes_on_different_devices_do_not_wait_for_each_other(sim_env: SimEnv) -> None:
    args = ("--kernels", "100", "--kernel-us", "5000", "--batch", "1")
    node = sim_env()
    first, second = start(node, *args, "--device", "0"), start(node, *args, "--device", "1")
    for report in [finish(first), finish(second)]:
        assert_takes(report, 0.5)
