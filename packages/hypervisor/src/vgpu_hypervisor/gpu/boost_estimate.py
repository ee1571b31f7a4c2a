"""How much faster a GPU runs its work now than it would saturated at its power limit.

A compute limit leaves a GPU partly idle, and GPU Boost spends the power headroom on clocks:
on an H100 a bf16 matmul paced to 25 % of the time ran each busy second ~11 % faster than the
same matmul unlimited, which holds the GPU at its 700 W limit. Charged by time alone, such a
pod would get ~28 % of its unlimited throughput. The limiter charges time times this factor.

Model. Over the last second, from NVML's energy counter and utilization U (the share of time a
kernel ran, whoever's), the power while busy is P_busy = (P - (1 - U) * P_idle) / U, where
P_idle is the power between kernels with clocks up. Saturated, the GPU would run at its power
limit P_limit, and the work rate follows power as a power law:

    boost = max(1, (P_busy / P_limit) ** EXPONENT)

An ideal cube law (dynamic power ~ clock * voltage², voltage following the clock) gives 1/3; a
voltage at its floor gives 1/2. With P_idle at 18 % of the limit, 0.4 fits what
benchmarks/limiter_power_gpu.py measured on an H100 in two runs within 0.8 % at every limit.
Predicted/measured speed-up per GPU-second of a bf16 4096³ matmul at 10/25/50/75 %:
1.114/1.109, 1.108/1.107, 1.125/1.118, 1.097/1.098 and 1.109/1.111, 1.128/1.133, 1.139/1.149,
1.093/1.092; fp32 and elementwise kernels, which stay below the limit, ~1.0 as measured. (With
P_idle at 16 %, the first fit, the model read 5-6 % high at 10 % and 1-2 % at 25 %: pods at
10 % got 9.3-9.4 %.) It is one factor per GPU: pods sharing a GPU share it.

U is NVML's utilization over the window, or the paced work's own share of it where that reads
busier (below): NVML samples the GPU in periods of its own, which at low utilization hold an
epoch or two of a paced pod, and the model divides by U. A window holds at least a few epochs'
busy time: one second where the GPU is busy, up to three at 10 %.

Only a steady load is measured: while utilization changes (a program starting or stopping) the
energy and utilization readings cover different loads, so the estimate is kept until the load
settles. A GPU's workload rarely changes between its busy spells, so the estimate kept through
an idle spell is usually right for the next one from its first kernel.

NVML's utilization reads a GPU a few points less busy than it is (an H100 running one unlimited
matmul loop, busy ~98 % of the time by the GPU's own timer, read 94.7 %; three paced pods that
kept it ~97 % busy, 92.5 %), which the model turns into a boost of ~1.03 for a GPU with no
headroom. The compute limiter adds every epoch's GPU time, measured by its events, to the device
lease (``busy_ns``); the share of time that paced work kept the GPU busy bounds the boost as the
utilization does (``ceiling``). A tenant can write that word, so it only ever lowers the boost.

The boost is charged to paced work only, so only windows in which paced work ran are estimated
(the activity of the device lease the daemon arbitrates, ``paced_at``): a GPU held at its power
limit by an unlimited program between two paced loads (a benchmark's baseline, a job outside
vgpu) is read, and bounds the boost while it runs (``ceiling``), but its estimate of 1 does not
replace the paced load's. Left in, pods at 25 % that started within seconds of an unlimited run
were charged 1.0 for their first 0.8 s and got 29.6-30.6 % in their first second (an H100,
PyTorch and CuPy matmuls); left out, 26.0-27.1 %. A window that still holds the last epoch's
activity is estimated: when an unlimited program follows paced work at the same utilization
(no restart), up to a window's length of it may enter the median.

Nothing here calls NVML: ``BoostEstimator.add`` takes readings and answers the estimate.
"""

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

IDLE_SHARE = 0.18
"""P_idle / P_limit: an H100 SXM drew 124-135 W of its 700 W with its clocks up between a paced
workload's epochs (NVML's instantaneous power, read every 20 ms)."""
WINDOW_S = 1.0
"""Readings older than this are forgotten, where the GPU is busy enough (below)."""
BUSY_IN_WINDOW_S = 0.25
"""At low utilization the window is longer, to hold this much of the GPU's busy time (about
eight 32-ms epochs), at most MAX_WINDOW_S: the window's power and its utilization count the
same epochs only up to the times of its ends (known to a reading each), and at 10 % a second
holds three epochs."""
MAX_WINDOW_S = 3.0
MIN_BUSY_IN_SPAN_S = 0.1
"""A window is estimated once it holds this much busy time (at least MIN_SPAN_S): after a
change of load, the new load's first estimates at 10 % came from 0.3-s windows of one epoch
or two, and read 1.04-1.06 where the load's was ~1.13."""
MIN_SPAN_S = 0.3
"""The energy counter moves in steps (every 100 ms on an H100): this much of them at least."""
GAP_S = 0.5
"""Readings this far apart are not one window: the older ones are dropped."""
MIN_BUSY = 0.05
"""Below this utilization the power says little about the work: the estimate is kept."""
MAX_BOOST = 1.5
EXPONENT = 0.4
STEADY = 0.3
"""The load is steady when the two halves of the window's utilization and of its power, and its
newest utilization reading and its mean, differ by at most this share of the larger."""
UTILIZATION_GRAIN = 0.08
"""Utilization readings this close are one load whatever their ratio: NVML read an H100 running
one 32-ms epoch every ~320 ms (a pod at 10 %) as 7 % in most sample periods and 14 % in those
that held two epochs. Taken as a change of load, each such pair started the window again, and
the estimates came from windows of a few readings: 1.00 to 1.33 where the load's was ~1.12."""
FIRST_ESTIMATES = 5
"""Windows a load's estimates wait for, where the GPU is less than PROMPT_BUSY busy, before they
are published (a GPU's first load) or replace the old load's: there one window alone may be off
by NVML's grain, which the median of several evens out. Busier, a load's first window is
published at once. Until then a GPU's pods are charged the old load's boost, or 1.0 with the
difference charged once the boost is known where there is none yet (the limiter keeps their GPU
time), and either must end early in their first second. Replayed through an H100's readings, a
PyTorch matmul at 25 % on a fresh daemon had its first boost 0.85-1.05 s after its first epoch
with five windows (it got 29.6-30.0 % of its first second), 0.2 s sooner with one; a JAX
matmul at 50 % was charged the 25 % load's 1.068 for its first second, where its own was 1.12.
A first window reads 1-5 % below where the median settles two seconds on, as the load's power
still rises (a median of its first three read the same, 0.1 s later): a pod is charged a little
less for a moment, where before it was charged 1.0 or another load's boost."""
PROMPT_BUSY = 2 * UTILIZATION_GRAIN
"""Where NVML's grain is at most half its reading. At 10 % a first window alone read 7.5 %
high (NVML's 7/14 grain); at 15 % and above, on the same synthetic readings, within 3 %, as
closely as later windows. Judged on NVML's utilization alone: the paced share, a tenant's to
write, decides nothing here."""
RECENT_S = 0.4
"""Utilization readings this recent bound the boost at once (see ``ceiling``)."""
PACED_WINDOW_S = 1.0
"""The paced work's GPU time is read over this long: it grows as epochs end (every ~32 ms), so
a shorter span would read the same load a tenth higher or lower."""
PACED_IDLE_S = 0.25
"""Paced work whose GPU time has not grown for this long has stopped: when it grows again, a new
load's paced share is read from there on. Read over the last second instead, a saturated pair's
share held its idle start for that second, and the ceiling let through the boost of the load
before (an H100: 1.08 for the first second of a 30/70 pair, which got 28.5 / 67.9). Over five
epochs: a load whose share could bound the boost (half the GPU or more) never pauses so long."""
PACED_KEPT_S = MAX_WINDOW_S + GAP_S
"""Readings of the paced work's GPU time are kept this long: as long as an energy window's."""
HISTORY = 40
"""The published boost is the median of this many latest window estimates (2 s of readings
every 50 ms): a window that straddles the end of the work (whose last 100 ms were idle, say)
slips through the checks above now and then, and P_busy magnifies its error by 1/U."""


def ceiling(busy: float) -> float:
    """The most boost a GPU busy ``busy`` of the time can have: its power at the limit (the
    model below, with the power controller holding the mean there)."""
    return boost_from(1.0, busy, 1.0)


def boost_from(power_w: float, busy: float, limit_w: float) -> float:
    """The model above for a window of mean power ``power_w`` and utilization ``busy`` (0..1].

    A mean above the limit is taken as the limit: the GPU's power controller holds it there, and
    more is the counter's step timing (a step's time is known to 50 ms, which over a 0.3-s span
    reads a saturated H100's 700 W as up to ~800 W). Left in, that error became a boost of 1.06
    for pods that kept the GPU 98 % busy, which then got 94 % of their share."""
    power_w = min(power_w, limit_w)
    idle_w = IDLE_SHARE * limit_w
    busy_w = (power_w - (1.0 - busy) * idle_w) / busy
    if busy_w <= limit_w:
        return 1.0
    return min(MAX_BOOST, float((busy_w / limit_w) ** EXPONENT))


@dataclass
class BoostEstimator:
    """One GPU's estimate from its readings, oldest first."""

    boost: float | None = None
    """The median of the latest window estimates, at most the ceiling of the latest utilization;
    None until one could be made."""
    _median: float | None = None
    _energy: deque[tuple[float, int]] = field(default_factory=deque)  # (time, mJ) when it moved
    _busy: deque[tuple[float, float]] = field(default_factory=deque)  # (time, utilization 0..1)
    _estimates: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    _paced: deque[tuple[float, int]] = field(default_factory=deque)  # (time, lease busy_ns)
    _paced_since: float = 0.0  # when the paced work now running started (PACED_IDLE_S)
    _paced_grew: float | None = None  # when its GPU time last grew
    _fresh: list[float] | None = None  # estimates since the window restarted at a change
    _window_s: float = WINDOW_S  # for the load last measured (BUSY_IN_WINDOW_S)

    def add(
        self,
        now: float,
        energy_mj: int | None,
        utilization: int | None,
        limit_mw: int | None,
        *,
        paced_busy_ns: int | None = None,
        paced_at: float | None = None,
    ) -> float | None:
        """Take one reading (``now`` in seconds, monotonic; None: the GPU did not answer that
        query, or no paced work's time was read) and give the estimate, which stays as it was
        when the readings say too little. ``paced_busy_ns``: the device lease's ``busy_ns``;
        ``paced_at``: when paced work last ran on the GPU (the lease's activity, on the clock of
        ``now``), None when not known (every window is then estimated)."""
        if paced_busy_ns is not None:
            self._add_paced(now, paced_busy_ns)
        if energy_mj is None or utilization is None or not limit_mw or limit_mw <= 0:
            return self.boost
        self._measure(now, energy_mj, utilization, limit_mw, paced_at)
        if self._median is not None:
            # A load that keeps the GPU busier than the one measured (a new pod's work) has at
            # most the boost its utilization leaves room for, from its first readings: the
            # median would take a second or two to follow, charging the new load the old one's
            # boost (on an H100, 1.15 of a 60 % load charged to pods keeping it 95 % busy).
            self.boost = min(self._median, self._ceiling(now))
        return self.boost

    def _ceiling(self, now: float) -> float:
        paced = self.paced_share(now)
        bound = ceiling(paced) if paced is not None and paced >= MIN_BUSY else MAX_BOOST
        recent = [value for at, value in self._busy if now - at <= RECENT_S]
        if not recent or sum(recent) / len(recent) < MIN_BUSY:
            return bound  # idle: the estimate is kept for the next busy spell
        return min(bound, ceiling(sum(recent) / len(recent)))

    def _add_paced(self, now: float, busy_ns: int) -> None:
        if self._paced and (busy_ns < self._paced[-1][1] or now - self._paced[-1][0] > GAP_S):
            self._paced.clear()  # a new lease, or readings resumed after a pause
            self._paced_grew = None
        if not self._paced:
            self._paced_since = now
        elif busy_ns > self._paced[-1][1]:
            if self._paced_grew is None or now - self._paced_grew > PACED_IDLE_S:
                self._paced_since = self._paced[-1][0]  # its last reading before it grew
            self._paced_grew = now
        self._paced.append((now, busy_ns))
        while len(self._paced) > 2 and now - self._paced[1][0] >= PACED_KEPT_S:
            self._paced.popleft()

    def paced_share(self, now: float) -> float | None:
        """The share of the last second that paced work kept the GPU busy (0..1), from when it
        started where that is later, or None while less than MIN_SPAN_S of readings are in, or
        none lately."""
        if not self._paced or now - self._paced[-1][0] > GAP_S:
            return None
        last = self._paced[-1][0]
        return self._paced_between(max(last - PACED_WINDOW_S, self._paced_since), last)

    def _paced_between(self, start: float, end: float) -> float | None:
        """The share of ``start``..``end`` that paced work kept the GPU busy, from the readings
        nearest to them within it; None when they span less than MIN_SPAN_S."""
        inside = [reading for reading in self._paced if start <= reading[0] <= end]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] < MIN_SPAN_S:
            return None
        (first, first_ns), (last, last_ns) = inside[0], inside[-1]
        return min(1.0, (last_ns - first_ns) / 1e9 / (last - first))

    def _measure(
        self, now: float, energy_mj: int, utilization: int, limit_mw: int, paced_at: float | None
    ) -> None:
        """Add the readings, and a window estimate to the median when the load was steady and
        paced work ran in it."""
        self._add_readings(now, energy_mj, utilization)
        window = self._window_estimate(limit_mw / 1000.0, paced_at)
        if window is not None and math.isfinite(window[0]):
            self._add_estimate(*window)

    def _add_readings(self, now: float, energy_mj: int, utilization: int) -> None:
        if self._busy and now - self._busy[-1][0] > GAP_S:
            self._energy.clear()  # readings resumed after a pause: the old ones say nothing
            self._busy.clear()
        if self._energy and energy_mj < self._energy[-1][1]:
            self._energy.clear()  # the counter started again (driver reloaded)
        if not self._energy or energy_mj != self._energy[-1][1]:
            self._energy.append((now, energy_mj))
        self._busy.append((now, min(max(utilization, 0), 100) / 100.0))
        while len(self._energy) > 2 and now - self._energy[1][0] > self._window_s:
            self._energy.popleft()
        while self._busy and self._busy[0][0] <= self._energy[0][0]:
            self._busy.popleft()

    def _window_estimate(
        self, limit_w: float, paced_at: float | None
    ) -> tuple[float, float] | None:
        """The window's estimate and NVML's utilization over it, None when the load was not
        steady or paced work did not run in it (or the window started again at a change of
        load)."""
        (first, first_mj), (last, last_mj) = self._energy[0], self._energy[-1]
        if last - first < MIN_SPAN_S:
            return None
        # Utilization over the span the energy covers (readings after its first step).
        middle = (first + last) / 2
        early = [value for at, value in self._busy if first < at <= middle]
        late = [value for at, value in self._busy if at > middle]
        if not early or not late:
            return None
        busy = (sum(early) + sum(late)) / (len(early) + len(late))
        if _differ(late[-1], busy, UTILIZATION_GRAIN):
            # The load changed (or NVML's utilization, which lags, is still moving): what the
            # window holds is another load's. It starts again from the newest counter step, and
            # the new load's first estimates replace the old load's (a median of 2 s of them
            # took 2 s to follow a quieter load: 30/30 after 30/70 was charged the saturated
            # GPU's boost for its first two seconds and got 32 % for 30). Seen before the power's
            # halves are compared: a 3-s window of a quiet load that an idle spell and a busier
            # load followed kept failing that test for 3 s, and the new load was charged the
            # estimates of its first, mixed windows.
            self._restart()
            return None
        if (
            busy < MIN_BUSY
            or _differ(sum(early) / len(early), sum(late) / len(late), UTILIZATION_GRAIN)
            or not self._steady_power(middle)
            # No paced work in the window: nothing is charged this load's boost.
            or (paced_at is not None and paced_at <= first)
        ):
            return None
        # Which windows are estimated follows NVML alone, so that the paced share, a tenant's
        # to write, changes no estimate but by lowering it.
        self._window_s = min(MAX_WINDOW_S, max(WINDOW_S, BUSY_IN_WINDOW_S / busy))
        if (last - first) * busy < MIN_BUSY_IN_SPAN_S:
            return None
        # The paced work's own GPU time over the same span, where it reads busier: NVML's
        # utilization samples the GPU in periods of its own and reads it a few points idler than
        # it is, most at low utilization (8 % for a pod at 10 %, whose epochs the limiter timed
        # at 10 %), which the model divides by.
        paced = self._paced_between(first, last)
        model_busy = max(busy, paced) if paced is not None else busy
        return boost_from((last_mj - first_mj) / (last - first) / 1000.0, model_busy, limit_w), busy

    def _restart(self) -> None:
        step = self._energy[-1]
        self._energy = deque([step])
        self._busy = deque(reading for reading in self._busy if reading[0] > step[0])
        self._fresh = []
        self._window_s = WINDOW_S

    def _add_estimate(self, estimate: float, busy: float) -> None:
        needed = 1 if busy >= PROMPT_BUSY else FIRST_ESTIMATES
        if self._fresh is not None:
            self._fresh.append(estimate)
            if len(self._fresh) < needed:
                return  # the old load's median stands until the new one has a few
            self._estimates.clear()
            self._estimates.extend(self._fresh)
            self._fresh = None
        else:
            self._estimates.append(estimate)
        if len(self._estimates) >= needed:
            self._median = statistics.median(self._estimates)

    def _steady_power(self, middle: float) -> bool:
        """Whether the window's two halves drew about the same power (energy steps around the
        middle split it): power falls at once when work stops, before NVML's utilization does."""
        (first, first_mj), (last, last_mj) = self._energy[0], self._energy[-1]
        split, split_mj = min(self._energy, key=lambda point: abs(point[0] - middle))
        if not first < split < last:
            return False
        return not _differ(
            (split_mj - first_mj) / (split - first), (last_mj - split_mj) / (last - split)
        )


def _differ(a: float, b: float, grain: float = 0.0) -> bool:
    return abs(a - b) > max(STEADY * max(a, b), grain)
