"""Boost correction: the estimate from power and utilization, and the daemon publishing it to
the limiter on the simulated GPU (whose busy power is VGPU_SIM_ACTIVE_POWER_W)."""

import csv
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from vgpu_common.limits import normalize_uuid
from vgpu_hypervisor.daemon.boost_publisher import BoostPublisher
from vgpu_hypervisor.gpu import NOT_AVAILABLE, nvml
from vgpu_hypervisor.gpu.boost_estimate import (
    FIRST_ESTIMATES,
    MAX_BOOST,
    BoostEstimator,
    boost_from,
    ceiling,
)
from vgpu_limiter.lease import DeviceLease, lease_path
from vgpu_limiter.region import ffi

from tests.hypervisor.conftest import Daemon
from tests.support.marks import per_second

SIM_GPU0 = "GPU-5157a1e0-0000-4000-8000-000000000001"


# --- the model -----------------------------------------------------------------------------


def test_work_below_the_power_limit_has_no_boost() -> None:
    assert boost_from(491.0, 1.0, 700.0) == 1.0  # elementwise kernels, unlimited
    assert boost_from(219.2, 0.25, 700.0) == 1.0  # the same at a 25 % limit


@pytest.mark.parametrize(
    ("power_w", "busy", "measured"),
    [
        *((205.1, 0.10, 1.109), (320.6, 0.25, 1.107), (532.6, 0.50, 1.118), (692.5, 0.75, 1.098)),
        *((204.0, 0.10, 1.111), (331.0, 0.25, 1.133), (548.0, 0.50, 1.149), (687.0, 0.75, 1.092)),
    ],
)
def test_the_h100_matmul_figures(power_w: float, busy: float, measured: float) -> None:
    """bf16 4096³ matmul paced on an H100, two runs: the speed-up per GPU-second that was
    measured, from the power and time share that were measured, within 1 % at every limit (with
    the gaps' power at 16 % of the limit instead of 18 % it read 5-6 % high at 10 %)."""
    assert boost_from(power_w, busy, 700.0) == pytest.approx(measured, rel=0.01)


@given(
    st.floats(0, 5000),
    st.floats(0.01, 1),
    st.floats(50, 1500),
    st.floats(0, 500),
)
def test_boost_is_bounded_and_grows_with_power(
    power_w: float, busy: float, limit_w: float, more_w: float
) -> None:
    boost = boost_from(power_w, busy, limit_w)
    assert 1.0 <= boost <= MAX_BOOST
    assert boost_from(power_w + more_w, busy, limit_w) >= boost


@given(st.floats(0.95, 1.0), st.floats(700.0, 900.0))
def test_a_saturated_gpu_has_no_boost_whatever_the_power_reads(busy: float, power_w: float) -> None:
    """A GPU kept 95-100 % busy has no idle time for boost to spend: a mean power read above the
    limit (the energy counter's step timing) must not make one, at most what 5 % idle allows."""
    assert boost_from(power_w, busy, 700.0) <= boost_from(700.0, 0.95, 700.0) < 1.021


def feed(
    estimator: BoostEstimator,
    power_w: float,
    busy: int,
    seconds: float,
    start: float = 0.0,
    *,
    paced: float | None = None,
    active: float | None = None,
) -> tuple[float | None, float]:
    """Readings every 25 ms of a counter that moves every 100 ms (every 4th reading) at
    `power_w`, from `start`; with `paced`, the lease's busy_ns grows by that share of the time in
    32-ms epochs; with `active`, the lease's activity is at that time, or (negative) paced work
    runs all along (its activity at every reading). The estimate and the time of the last
    reading."""
    energy = estimator._energy[-1][1] if estimator._energy else 0
    readings = round(seconds / 0.025)
    for tick in range(1, readings + 1):
        if tick % 4 == 0:
            energy += round(power_w * 100)  # mJ in 100 ms
        now = start + tick * 0.025
        busy_ns = None
        if paced is not None:  # whole epochs ended by now
            busy_ns = int(now * paced / 0.032) * 32_000_000
        paced_at = None if active is None else now if active < 0 else active
        estimator.add(now, energy, busy, 700_000, paced_busy_ns=busy_ns, paced_at=paced_at)
    return estimator.boost, start + readings * 0.025


def test_the_estimate_follows_the_readings() -> None:
    estimator = BoostEstimator()
    assert estimator.add(0.0, 1000, 25, 700_000) is None  # one reading says nothing
    boost, now = feed(estimator, 320.6, 25, 0.2)
    assert boost is None  # under 0.3 s of counter steps
    boost, now = feed(estimator, 320.6, 25, 1.0, now)
    assert boost == pytest.approx(boost_from(320.6, 0.25, 700.0), rel=0.02)
    # Idle (at the model's idle power): the estimate is kept, not dragged to 1 by a GPU that
    # does nothing.
    kept, now = feed(estimator, 126.0, 0, 2.0, now)
    assert kept == pytest.approx(boost, rel=0.03)
    # A query that fails keeps it too; a counter that starts again is not negative power.
    assert estimator.add(now + 0.025, None, 25, 700_000) == kept
    assert estimator.add(now + 0.05, 5, 25, 700_000) == kept
    saturated, _ = feed(estimator, 700.0, 100, 1.5, now + 0.05)
    assert saturated == 1.0


def test_a_busier_load_gets_at_most_the_boost_its_utilization_allows_at_once() -> None:
    """Pods that keep the GPU 98 % busy start after a 60 % load: within half a second the boost
    is what 98 % leaves room for, not the 60 % load's, which the median would keep for seconds."""
    estimator = BoostEstimator()
    partial, now = feed(estimator, 532.6, 60, 2.0)
    assert partial is not None and partial > 1.05
    busier, now = feed(estimator, 700.0, 98, 0.5, now)
    assert busier is not None and busier <= ceiling(0.98) < 1.01
    # Idle again: the newest load's own estimate is kept for its next busy spell (a fresh
    # window measured it within the half second), and an idle GPU does not lower it.
    _, now = feed(estimator, 126.0, 0, 1.0, now)
    assert estimator.boost == pytest.approx(boost_from(700.0, 0.98, 700.0), rel=0.005)


def test_a_quieter_load_gets_its_own_estimate_within_a_second() -> None:
    """30/30 after 30/70: the saturated load's boost (1.0) is not charged to the quieter load
    for seconds (a median of 2 s of the old load's estimates took 2 s to follow)."""
    estimator = BoostEstimator()
    saturated, now = feed(estimator, 700.0, 98, 2.0)
    assert saturated is not None and saturated < 1.01
    quieter, now = feed(estimator, 532.6, 50, 1.0, now)
    assert quieter == pytest.approx(boost_from(532.6, 0.5, 700.0), rel=0.01)


def test_an_unpaced_load_between_two_paced_ones_leaves_their_estimate() -> None:
    """A benchmark's unlimited baseline (or a job outside vgpu) holds the GPU at its power limit
    between two paced loads: while it runs the boost is what its utilization allows (1), but its
    own estimate of 1 is not what the next paced load is charged from its first second."""
    estimator = BoostEstimator()
    paced, now = feed(estimator, 320.6, 25, 2.0, active=-1)
    assert paced is not None and paced > 1.05
    ended = now
    saturated, now = feed(estimator, 700.0, 98, 3.0, now, active=ended)
    assert saturated is not None and saturated <= ceiling(0.98) < 1.01
    _, now = feed(estimator, 126.0, 0, 1.0, now, active=ended)  # the next pod starting up
    again, _ = feed(estimator, 320.6, 25, 0.3, now, active=-1)
    assert again == pytest.approx(paced, rel=0.01)
    # Without the lease's activity every window counts, as before: the saturated load's 1 is
    # kept until the new load's own estimates come.
    unknown = BoostEstimator()
    _, now = feed(unknown, 320.6, 25, 2.0)
    _, now = feed(unknown, 700.0, 98, 3.0, now)
    _, now = feed(unknown, 126.0, 0, 1.0, now)
    kept, _ = feed(unknown, 320.6, 25, 0.3, now)
    assert kept is not None and kept < 1.01


def test_the_ceiling_bounds_the_boost_at_once_and_the_load_comes_back_after_it() -> None:
    """A paced share that says the GPU is saturated caps what is published from its first
    readings, and enters the estimates while it lasts; once it goes, the load's own estimate
    comes back as its windows fill the median (2 s)."""
    estimator = BoostEstimator()
    partial, now = feed(estimator, 532.6, 60, 2.0)
    capped, now = feed(estimator, 532.6, 60, 1.0, now, paced=0.99)
    assert partial is not None and partial > 1.05
    assert capped is not None and capped <= ceiling(0.98) < 1.01
    after, now = feed(estimator, 532.6, 60, 3.0, now)  # no paced readings: the bound goes
    assert after == pytest.approx(partial, rel=0.01)


def sampled(
    estimator: BoostEstimator,
    power_w: float,
    readings: list[int],
    paced: float,
    seconds: float,
) -> Iterator[float]:
    """Like ``feed``, from the estimator's last reading on, with NVML's utilization read every
    200 ms from ``readings`` in turn (as the daemon does) and the lease's busy_ns at ``paced`` in
    whole 32-ms epochs: the time of every reading, once the estimator has it."""
    energy = estimator._energy[-1][1] if estimator._energy else 0
    start = estimator._busy[-1][0] if estimator._busy else 0.0
    for tick in range(1, round(seconds / 0.025) + 1):
        if tick % 4 == 0:
            energy += round(power_w * 100)
        now = start + tick * 0.025
        utilization = readings[(tick // 8) % len(readings)]
        busy_ns = int(tick * 0.025 * paced / 0.032) * 32_000_000
        estimator.add(now, energy, utilization, 700_000, paced_busy_ns=busy_ns, paced_at=now)
        yield now


def feed_sampled(
    estimator: BoostEstimator,
    power_w: float,
    readings: list[int],
    paced: float,
    seconds: float,
) -> list[tuple[float, float | None]]:
    """``sampled``'s readings: the time and the published estimate of every one."""
    return [(at, estimator.boost) for at in sampled(estimator, power_w, readings, paced, seconds)]


def test_a_pod_at_10_percent_is_estimated_from_its_own_gpu_time_through_nvml_s_grain() -> None:
    """An H100 with one pod at 10 %: NVML read 7 % in most sample periods and 14 % in those
    that held two epochs (a mean near 8 %), while the limiter's epochs said 10 %. Each step
    between 7 and 14 used to start the window again, and NVML's 8 % made the boost 1.17-1.33
    where the load's was ~1.11; the estimate is now the model at the paced share, from a window
    long enough to hold several epochs, within about 2 s."""
    estimator = BoostEstimator()
    published = feed_sampled(estimator, 205.1, [7, 7, 14, 7, 7, 7, 14, 0, 7], 0.10, 6.0)
    expected = boost_from(205.1, 0.10, 700.0)
    assert expected == pytest.approx(1.109, rel=0.01)
    first = next(at for at, boost in published if boost is not None)
    assert first <= 2.5
    assert all(boost == pytest.approx(expected, rel=0.03) for _, boost in published if boost)
    # NVML's mean alone (no busy time read) gives the higher estimate the pods were charged.
    nvml_only, _ = feed(BoostEstimator(), 205.1, 8, 3.0)
    assert nvml_only is not None and nvml_only > expected * 1.04


@given(
    st.floats(150, 750),  # the load's mean power, W
    st.integers(5, 100),  # and NVML's utilization, %
    st.floats(0, 1.2),  # the share busy_ns says paced work ran
    st.lists(
        st.tuples(
            st.floats(-0.1, 0.1),  # this reading's power off the load's, as a share
            st.integers(-8, 8),  # its utilization off the load's, points
            st.one_of(st.none(), st.integers(-(10**10), 10**10)),  # a scribble of busy_ns
        ),
        min_size=1,
        max_size=120,
    ),
)
def test_the_paced_time_only_ever_lowers_the_estimate(
    power_w: float, utilization: int, share: float, readings: list[tuple[float, int, int | None]]
) -> None:
    """The lease's busy_ns is any paced pod's to write: whatever it says, every published
    estimate is at most the one NVML's readings alone give, and published at the same readings.
    Loads near steady, read every 50 ms, so that estimates are made."""
    with_paced, without = BoostEstimator(), BoostEstimator()
    now, energy, busy_ns, published = 0.0, 0, 0, 0
    for power_off, utilization_off, scribble in readings:
        now += 0.05
        energy += round(power_w * (1 + power_off) * 50)
        busy_ns = max(0, busy_ns + round(share * 50e6) + (scribble or 0))
        reading = min(100, max(0, utilization + utilization_off))
        lowered = with_paced.add(now, energy, reading, 700_000, paced_busy_ns=busy_ns, paced_at=now)
        plain = without.add(now, energy, reading, 700_000, paced_at=now)
        assert (lowered is None) == (plain is None)
        assert lowered is None or plain is None or lowered <= plain + 1e-12
        published += plain is not None
    note(f"published {published} of {len(readings)}")


H100_READINGS = Path(__file__).parent / "data/boost_readings_h100.csv"


def test_the_h100_s_readings_at_10_percent_give_a_steady_estimate() -> None:
    """Readings an H100 gave the daemon (tests/hypervisor/data): a fresh daemon's first load, a
    PyTorch matmul pod at 10 %, then CuPy at 25 % and 10 %. The estimator before published 1.327
    first for the PyTorch pod and ranged 1.00-1.33 through both loads at 10 %, where the pods'
    throughput put their boost near 1.13-1.16; on the same readings it now stays within 1.07 and
    1.20 (the lowest where a load starts) and publishes within 3 s."""
    lines = [line for line in H100_READINGS.read_text().splitlines() if not line.startswith("#")]
    estimator = BoostEstimator()
    published: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for row in list(csv.DictReader(lines)):
        at = float(row["seconds"])
        boost = estimator.add(
            at,
            int(row["energy_mj"]),
            int(row["utilization"]) if row["utilization"] else None,
            int(row["limit_mw"]),
            paced_busy_ns=int(row["paced_busy_ns"]),
            paced_at=float(row["paced_at"]) if row["paced_at"] else None,
        )
        if boost is not None:
            published[at <= 15.0].append((at, boost))
    first_load, later_loads = published[True], published[False]
    assert first_load and first_load[0][0] <= 3.0
    assert all(1.10 <= boost <= 1.20 for _, boost in first_load)
    # A load's first window, published at once, reads a little low: 1.078 where CuPy at 25 %
    # starts, 1.14 two seconds on.
    assert later_loads and all(1.07 <= boost <= 1.17 for _, boost in later_loads)


def test_paced_time_below_nvml_s_reading_does_not_raise_the_boost() -> None:
    """The lease's busy time is a tenant's to write: one that says less than NVML reads (paced
    work idle, an unpaced program busy) leaves the estimate NVML's; one that says more lowers
    it, which only ever charges tenants less."""
    from_nvml, _ = feed(BoostEstimator(), 320.6, 25, 3.0)
    quieter, _ = feed(BoostEstimator(), 320.6, 25, 3.0, paced=0.05)
    busier, _ = feed(BoostEstimator(), 320.6, 25, 3.0, paced=0.60)
    assert from_nvml is not None and quieter == pytest.approx(from_nvml, rel=0.005)
    assert busier is not None and busier < from_nvml


def test_paced_work_that_keeps_the_gpu_busy_has_no_boost_where_nvml_reads_it_less_busy() -> None:
    """Three paced pods kept an H100 ~97 % busy at its power limit while NVML read 92 %: the
    model alone gives a boost of ~1.03; the pods' own measured GPU time says there is none."""
    alone, _ = feed(BoostEstimator(), 700.0, 92, 3.0)
    assert alone is not None and alone > 1.025
    measured, _ = feed(BoostEstimator(), 700.0, 92, 3.0, paced=0.97)
    assert measured is not None and measured <= ceiling(0.96) < 1.015


def test_paced_work_of_a_partly_idle_gpu_is_estimated_at_its_own_share() -> None:
    """A pod alone at 50 %, and 30/30 where NVML reads 55 % and the pods' epochs 60 %: the
    paced share bounds nothing the model gives, and where it reads busier than NVML the model
    takes it."""
    for power_w, busy, paced in ((532.6, 50, 0.5), (560.0, 55, 0.6)):
        plain, _ = feed(BoostEstimator(), power_w, busy, 3.0)
        measured, _ = feed(BoostEstimator(), power_w, busy, 3.0, paced=paced)
        assert plain is not None and plain > 1.05
        # Within the epochs' grain: a 1-s window holds 15 or 16 epochs of a pod at 50 %.
        assert measured == pytest.approx(boost_from(power_w, paced, 700.0), rel=0.01)


def test_a_new_load_s_paced_share_is_read_from_its_start() -> None:
    """A saturated pair that starts after a quieter load and an idle spell, while NVML's
    utilization still climbs: its paced share, read from its start and not over a second that
    holds the idle spell, bounds the old load's boost once 0.3 s of it are in. Read over the
    second, the old load's 1.10 was published for 0.6 s and the pair's first second charged
    for it (an H100's first second of 30/70: 1.08)."""
    estimator = BoostEstimator()
    now, energy, busy_ns = 0.0, 0, 0

    def reading(power_w: float, utilization: int, paced: float) -> float | None:
        nonlocal now, energy, busy_ns
        now += 0.025
        if round(now / 0.025) % 4 == 0:
            energy += round(power_w * 100)
        busy_ns += round(paced * 25_000_000)
        whole_epochs = busy_ns // 32_000_000 * 32_000_000
        return estimator.add(now, energy, utilization, 700_000, paced_busy_ns=whole_epochs)

    for _ in range(80):
        old = reading(320.6, 25, 0.25)
    assert old is not None and old > 1.08
    for _ in range(40):
        reading(126.0, 0, 0.0)  # idle: the lease is read, its time does not grow
    published = [reading(700.0, min(95, 4 * tick), 0.97) for tick in range(1, 41)]
    assert all(boost is not None and boost <= ceiling(0.9) for boost in published[13:])


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_a_scribbled_busy_word_only_ever_lowers_the_boost(first: int, second: int) -> None:
    """The lease's busy_ns is a word every paced pod writes: whatever it reads, the boost is
    the plain estimate or less, never more, and never below 1."""
    plain, _ = feed(BoostEstimator(), 320.6, 25, 1.5)
    estimator = BoostEstimator()
    _, now = feed(estimator, 320.6, 25, 1.5)
    estimator.add(now + 0.025, 1, 25, 700_000, paced_busy_ns=first)
    boost = estimator.add(now + 0.5, 1, 25, 700_000, paced_busy_ns=second)
    assert plain is not None and boost is not None and 1.0 <= boost <= plain


@given(st.floats(0.05, 1.0), st.floats(0.0, 0.95))
def test_the_ceiling_falls_as_the_gpu_gets_busier(busy: float, less: float) -> None:
    assert 1.0 <= ceiling(busy) <= ceiling(busy * less if busy * less >= 0.01 else 0.01)


def _estimates_when_first_published(
    estimator: BoostEstimator, power_w: float, readings: list[int], paced: float
) -> int:
    """How many windows of a load (``sampled``) had been estimated when the estimate first
    changed; 0 if it did not within 5 s."""
    before = estimator.boost
    for _ in sampled(estimator, power_w, readings, paced, 5.0):
        if estimator.boost != before:
            fresh = estimator._fresh
            return len(estimator._estimates) if fresh is None else len(fresh)
    return 0


def test_a_load_s_first_window_is_published_at_once_where_the_gpu_is_busy() -> None:
    """Where NVML reads the GPU at least 16 % busy, a load's first window's estimate is
    published at once: a GPU's first (its pods' GPU time was charged 1.0 meanwhile, and is
    charged the difference then), or one that replaces the old load's (charged meanwhile)."""
    estimator = BoostEstimator()
    assert _estimates_when_first_published(estimator, 320.6, [25], 0.25) == 1
    # The window's first reading is no counter step: its power reads 5 % high.
    expected = boost_from(320.6, 0.25, 700.0)
    assert estimator.boost == pytest.approx(expected, rel=0.035)
    boost, _ = feed(estimator, 320.6, 25, 1.0, estimator._busy[-1][0])
    assert boost == pytest.approx(expected, rel=0.02)
    assert _estimates_when_first_published(estimator, 480.0, [50], 0.5) == 1  # another load
    assert estimator.boost == pytest.approx(boost_from(480.0, 0.5, 700.0), rel=0.035)


def test_a_tenant_s_paced_share_does_not_make_a_quiet_load_s_first_window_count() -> None:
    """Whether a first window is published at once follows NVML alone: a lease's busy_ns that
    claims the GPU half busy, where NVML reads 8 %, still waits for five windows."""
    claimed = _estimates_when_first_published(BoostEstimator(), 205.1, [8], 0.5)
    assert claimed == FIRST_ESTIMATES


def test_at_low_utilization_a_load_s_windows_are_published_once_several_agree() -> None:
    """At 10 % a first window alone read 7.5 % high on NVML's 7/14 grain: a load's estimates
    are published, or replace the old load's, once five windows were estimated (their median)."""
    sampled = [7, 7, 14, 7, 7, 7, 14, 0, 7]
    assert _estimates_when_first_published(BoostEstimator(), 205.1, sampled, 0.1) == 5
    estimator = BoostEstimator()
    old, _ = feed(estimator, 480.0, 50, 3.0)
    assert old is not None
    assert _estimates_when_first_published(estimator, 205.1, sampled, 0.1) == FIRST_ESTIMATES


# --- the daemon and the limiter ----------------------------------------------------------------


class _ArbitratedLease:
    """The daemon's own lease of a GPU, as its arbiter keeps it: paced work ran at 12.5 s."""

    def active_within(self, seconds: float) -> bool:
        return True

    def busy_ns(self) -> int:
        return 0

    def last_active(self) -> float:
        return 12.5

    def publish_boost(self, boost: float) -> None:
        pass


class _Broker:
    def device_lease(self, uuid: str) -> _ArbitratedLease:
        return _ArbitratedLease()


def test_the_publisher_trusts_only_the_activity_of_a_lease_it_arbitrates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The activity word of a lease the daemon arbitrates is its own; a lease file's is every
    paced process's to write, so with one every window is estimated, as before."""
    for name, value in (
        ("device_handle", object()),
        ("device_uuid", SIM_GPU0),
        ("device_power_limit", 700_000),
        ("device_utilization", (25, 0)),
        ("device_energy", 1000),
    ):
        monkeypatch.setattr(nvml, name, lambda *_, value=value: value)
    seen: list[float | None] = []

    def add(self: BoostEstimator, *args: Any, paced_at: float | None = None, **_: Any) -> None:
        seen.append(paced_at)

    monkeypatch.setattr(BoostEstimator, "add", add)
    BoostPublisher(tmp_path, 1, _Broker()).tick()  # type: ignore[arg-type]
    assert seen == [12.5]
    seen.clear()
    with DeviceLease.open(tmp_path, SIM_GPU0):  # the lease file, active now
        offset = ffi.offsetof("struct vgpu_device_lease", "activity_ns")
        with lease_path(tmp_path, normalize_uuid(SIM_GPU0)).open("r+b") as file:
            file.seek(offset)
            file.write(time.monotonic_ns().to_bytes(8, sys.byteorder))
    publisher = BoostPublisher(tmp_path, 1)
    publisher.tick()
    publisher.close()
    assert seen == [None]


def test_an_estimate_is_withdrawn_while_the_gpu_s_readings_keep_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the last estimate (1.108) was published through 10 s of failing energy readings
    at 100 % utilization, where the GPU's boost was 1: pods lost a tenth of their share."""
    readings: dict[str, object] = {
        "device_handle": object(),
        "device_uuid": SIM_GPU0,
        "device_power_limit": 700_000,
        "device_utilization": (100, 0),
        "device_energy": 1000,
    }
    for name in tuple(readings):  # read at each call: the test changes them
        monkeypatch.setattr(nvml, name, lambda *_, name=name: readings[name])
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])

    def add(self: BoostEstimator, *args: Any, **_: Any) -> float:
        self.boost = 1.108
        return self.boost

    monkeypatch.setattr(BoostEstimator, "add", add)
    with DeviceLease.open(tmp_path, SIM_GPU0) as reader:
        publisher = BoostPublisher(tmp_path, 1)
        monkeypatch.setattr(BoostPublisher, "_paced", staticmethod(lambda gpu: True))
        publisher.tick()
        assert reader.boost() == pytest.approx(1.108, abs=0.001)
        readings["device_energy"] = NOT_AVAILABLE
        for _ in range(30):  # 1.5 s: a window or so of failures keeps the estimate
            now[0] += 0.05
            publisher.tick()
        assert reader.boost() == pytest.approx(1.108, abs=0.001)
        for _ in range(20):
            now[0] += 0.05
            publisher.tick()
        assert reader.boost() is None  # withdrawn: plain GPU time is charged
        assert publisher.boosts() == {}  # nor shown by the API and the metrics
        readings["device_energy"] = 2000
        now[0] += 0.05
        publisher.tick()
        assert reader.boost() == pytest.approx(1.108, abs=0.001)
        assert publisher.boosts() == {SIM_GPU0: pytest.approx(1.108)}
        # A reading that failed just before the paced work stopped is no failing GPU: one not
        # read keeps its estimate for its next busy spell.
        readings["device_energy"] = NOT_AVAILABLE
        now[0] += 0.05
        publisher.tick()
        monkeypatch.setattr(BoostPublisher, "_paced", staticmethod(lambda gpu: False))
        for _ in range(60):
            now[0] += 0.05
            publisher.tick()
        assert reader.boost() == pytest.approx(1.108, abs=0.001)
        publisher.close()


def _boosted_run(daemon: Daemon, pod: str, limit: int) -> list[float]:
    """Percent of GPU 0's time a 1-ms-kernel workload at `limit` got in each of 5 s."""
    reply = daemon.api(
        "POST", "/api/v1/pods", json={"name": pod, "gpus": {"0": {"compute": limit}}}
    )
    assert reply.status_code == 201, reply.text
    worker = daemon.workload(pod, "--duration", "5", "--kernel-us", "1000", "--marks")
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    return [w / 10 for w in per_second(json.loads(out)["marks"], 5)]


def _assert_paced(windows: list[float], share: float) -> None:
    """No second above the share, and the run as a whole at it. A second below is not held
    against the limiter: on a loaded machine the program itself may not get the CPU to launch."""
    assert max(windows) <= share + 3.0, windows
    assert sum(windows) / len(windows) == pytest.approx(share, abs=3.0), windows


def test_the_daemon_publishes_the_boost_and_the_pod_is_charged_for_it(tmp_path: Path) -> None:
    """The simulated GPU draws 950 W busy against a 700 W limit: boost (950/700)^0.4 = 1.130,
    so a pod at 25 % gets 22.1 % of its time once the estimate is in (after its first second)."""
    daemon = Daemon(tmp_path)
    daemon.environment["VGPU_SIM_ACTIVE_POWER_W"] = "950"
    daemon.start()
    try:
        windows = _boosted_run(daemon, "boosted", 25)
        with DeviceLease.open(daemon.base, SIM_GPU0) as lease:
            published = lease.boost()
            assert published is not None and published == pytest.approx(1.130, abs=0.04)
        _assert_paced(windows[1:], 25 / 1.130)
        # Logged as it changes by 0.05 or more from what was last logged: the first estimate may
        # be 1.08-1.10 on a loaded machine, and the log then says no more while the estimate
        # stays within 0.05 of it.
        logged = re.findall(r"GPU 0 boost (\d\.\d+)", daemon.log_file.read_text())
        assert logged and abs(float(logged[-1]) - published) < 0.05, (logged, published)
        (gpu0, gpu1) = daemon.http.get("/api/v1/gpus").json()
        assert gpu0["boost"] == pytest.approx(1.130, abs=0.04) and gpu1["boost"] is None
        metrics = daemon.http.get("/metrics").text
        (line,) = [m for m in metrics.splitlines() if m.startswith("tf_gpu_boost_ratio{")]
        assert 'gpu="0"' in line, metrics
        assert float(line.rsplit(" ", 1)[1]) == pytest.approx(1.130, abs=0.04)
        table = daemon.cli("gpus")
        assert table.returncode == 0, table.stderr
        shown = re.search(r"^\s*0 .* (1\.\d\d)\s+1\s+\d+\s*$", table.stdout, re.MULTILINE)
        assert "Boost" in table.stdout and shown, table.stdout
        assert float(shown[1]) == pytest.approx(1.130, abs=0.06)  # read after the run ended
        assert daemon.stop() == 0
        with DeviceLease.open(daemon.base, SIM_GPU0) as lease:
            assert lease.boost() is None  # withdrawn on the way out
    finally:
        daemon.close()


def test_boost_correction_can_be_turned_off(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, extra=("--no-boost-correction",))
    daemon.environment["VGPU_SIM_ACTIVE_POWER_W"] = "950"
    daemon.start()
    try:
        windows = _boosted_run(daemon, "plain", 25)
        _assert_paced(windows, 25)
        with DeviceLease.open(daemon.base, SIM_GPU0) as lease:
            assert lease.boost() is None
        shown = daemon.cli("config", "show", "--no-boost-correction", "--json")
        assert shown.returncode == 0, shown.stderr
    finally:
        daemon.close()


def test_a_gpu_without_an_energy_counter_publishes_nothing() -> None:
    estimator = BoostEstimator()
    for step in range(100):
        assert estimator.add(step * 0.025, None, 50, 700_000) is None
    assert estimator.add(3.0, 1000, 50, None) is None


def test_a_changing_load_is_not_measured() -> None:
    """A program starting: utilization rising within the window (NVML's lags the power) says
    nothing reliable, and the steady estimate from before is kept until the load settles."""
    estimator = BoostEstimator()
    steady, now = feed(estimator, 320.6, 25, 1.5)
    assert steady is not None
    _, now = feed(estimator, 126.0, 0, 1.5, now)
    ramp, now = feed(estimator, 600.0, 5, 0.5, now)  # power up first, utilization lagging
    assert ramp == pytest.approx(steady, rel=0.03)  # not the 1.5 this window alone gives
    settled, _ = feed(estimator, 600.0, 60, 1.5, now)
    assert settled == pytest.approx(boost_from(600.0, 0.6, 700.0), rel=0.02)


def test_readings_after_a_pause_start_a_new_window() -> None:
    """The daemon stops reading a GPU without paced work; when it starts again, the energy used
    meanwhile (by unlimited work, say) is not taken for the new load's."""
    estimator = BoostEstimator()
    steady, now = feed(estimator, 320.6, 25, 1.5)
    estimator._energy.append((now + 5.0, estimator._energy[-1][1] + 5 * 700_000))
    resumed, _ = feed(estimator, 320.6, 25, 0.2, now + 5.0)
    assert resumed == steady  # too little since the pause for a new estimate
    assert len(estimator._energy) <= 3


def test_going_idle_below_the_models_idle_power_keeps_the_estimate() -> None:
    """An H100 that stops working drops to ~70 W, under the model's 126 W between kernels: the
    windows that straddle the stop would give too small a boost. NVML's utilization falls as
    soon as the work stops, so those windows are not measured."""
    estimator = BoostEstimator()
    steady, now = feed(estimator, 532.6, 50, 1.5)
    for _ in range(8):  # every 100 ms of the first 0.8 s of idle
        kept, now = feed(estimator, 72.0, 0, 0.1, now)
        assert kept == pytest.approx(steady, rel=0.01)
