"""Which pods want each GPU now, and how much of it they use, for the scheduling policy
(scheduler.py): a GPU is divided among the pods that use it, never among pods that merely exist,
and a pod with a soft limit takes what the others leave.

A pod wants a GPU when it has a live process and, within the last WANT_WINDOW_NS, a pass saw its
GPU time on it grow (it launched work) or its waiting time grow (its launches waited for their
share or for the lease): both counters are in its region's device entry, kept by its own
processes. A pod made and never used, one whose processes exited or sleep on the CPU, a frozen
pod: none of them takes anything from the others. Its use is its GPU time over the last
USE_WINDOW_NS or more, measured from when it started to want the GPU (until then the policy
counts it at its whole limit).

Both are judged over windows of their own, not over the time since the previous pass: passes
also run after every change through the API and every Kubernetes event, milliseconds apart, and
a busy pod's counters move only as its epochs end or its waits do (every 32 ms at 100 %, every
320 ms at 10 %). Judged pass to pass, two busy pods at 60 % were seen idle in half of twenty
passes made by quick API calls, and the GPU was not divided until the next periodic pass.

A pod seen for the first time (a new pod, or every pod after the daemon restarts) wants nothing
until a pass sees its counters move: counted wanting for its live process alone, every idle pod
with a process divided the GPU for the daemon's first pass after a restart. A pod that starts
launching runs at its own limit until a pass weighs it in (the device lease still takes turns).

The counters are the tenant's to write: a pod that stops its own to look idle keeps its own
limit where it would have been scaled down, never more than that limit (the lease still divides
the GPU's time between the pods that run)."""

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vgpu_common.limits import WHOLE_GPU

from vgpu_hypervisor.daemon.pods import PodKey, PodRecord

DeviceKey = tuple[PodKey, int]  # a pod and the index of its device entry

WANT_WINDOW_NS = 1_000_000_000
"""A pod wants a GPU while a pass saw its counters move this recently. A pod at limit L alone
ends an epoch (and its wait for its share) every 32 ms / L: every 320 ms at 10 %, every second at
3.2 %. Below that it is weighed in some passes only, a point's difference at most."""
USE_WINDOW_NS = 900_000_000
"""A pod's use is measured over at least this long (at every pass of the default one-second
period): over a pass a few milliseconds long, a busy pod's GPU time moves by a whole epoch or
not at all."""
HELD_BUSY = 9000
"""A pod whose GPU time and time waited (for its share, or for another pod's epoch) add up to
this share of its use window or more (hundredths) never let the GPU go for lack of work: what
it used is what it was let, not what it wants. A light pod beside busy ones idles between its
bursts, however long each waits for the lease (a sixth of the GPU in rounds that waited 11 %
of the time, on the simulated GPU); one held back by its bucket, or by a bursting pod, is
running or waiting all of the time."""
FIRST_USE_WINDOW_NS = 250_000_000
"""A pod that starts to want a GPU is first measured over this long (the daemon makes its next
pass that soon): until then it is counted at its whole limit, and a bursting pod beside it gets
nothing above its hard limit. Waiting a whole window cost a training pod (burst 100) beside an
inference pod that had just started 4.6 points of its first six seconds on an H100."""


@dataclass(frozen=True)
class Demand:
    """One pass's reading: who wants each GPU, and what each used (hundredths of the GPU over
    the last USE_WINDOW_NS or more; absent until a window was measured)."""

    wanting: set[DeviceKey] = field(default_factory=set)
    usage: dict[DeviceKey, int] = field(default_factory=dict)
    held: set[DeviceKey] = field(default_factory=set)
    """Pods that ran or waited (for their share, or for another pod's epoch) HELD_BUSY or more
    of their last window: they would use more than they did."""

    @property
    def unhindered_usage(self) -> dict[DeviceKey, int]:
        """The use of the pods nothing held back: what the policy weighs a pod at when it is
        below its share. A held pod's use says only how much it was let: counted by it, a
        critical pod that woke beside a bursting one read a few points under its limit, left
        the burster its rate, and was held there for seconds."""
        return {key: used for key, used in self.usage.items() if key not in self.held}

    @property
    def measuring(self) -> bool:
        """Whether a pod that wants a GPU has no use measured yet (the next pass should come
        within FIRST_USE_WINDOW_NS)."""
        return any(key not in self.usage for key in self.wanting)


@dataclass
class _Seen:
    """One pod's device entry as the passes saw it."""

    counters: tuple[int, int]  # (gpu_ns, throttled_ns) at the last pass
    moved_ns: int | None  # when a pass last saw them move; None: not since first seen
    since_ns: int  # the start of the use window
    since_gpu_ns: int  # gpu_ns then
    used: int | None  # the last window's use (hundredths)
    wanted: bool = False  # what the last pass judged
    since_throttled_ns: int = 0  # throttled_ns at the start of the use window
    waited: int = 0  # the last window's time waited (hundredths of it)


class DemandTracker:
    """The pods' counters as the passes saw them, and from them who wants each GPU now."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock
        self._seen: dict[DeviceKey, _Seen] = {}

    def observe(self, records: Iterable[PodRecord]) -> Demand:
        """Take a pass's records and say who wants each GPU now."""
        now = self._clock()
        seen: dict[DeviceKey, _Seen] = {}
        demand = Demand()
        for record in records:
            if record.error is not None:
                continue
            frozen_gpus = {uuid.lower() for uuid in record.frozen_gpus}
            for device in record.devices:
                key = (record.key, device.index)
                entry = self._update(self._seen.get(key), (device.gpu_ns, device.throttled_ns), now)
                seen[key] = entry
                if record.frozen and (not frozen_gpus or device.uuid.lower() in frozen_gpus):
                    # Frozen: it launches nothing until thawed, whatever its counters did
                    # since (its backlog draining). Before, it counted for up to a second
                    # after the freeze, and a 60 % pod beside it was held to 49. Thawed, it is
                    # measured afresh from its first move.
                    entry.moved_ns, entry.wanted = None, False
                    continue
                # No live process: none launches or waits now, whatever moved before it went.
                entry.wanted = (
                    bool(record.processes)
                    and entry.moved_ns is not None
                    and now - entry.moved_ns < WANT_WINDOW_NS
                )
                if entry.wanted:
                    demand.wanting.add(key)
                    if entry.used is not None:
                        demand.usage[key] = entry.used
                        if entry.used + entry.waited >= HELD_BUSY:
                            demand.held.add(key)
        self._seen = seen
        return demand

    @staticmethod
    def _update(before: _Seen | None, counters: tuple[int, int], now: int) -> _Seen:
        if before is None or counters[0] < before.counters[0] or counters[1] < before.counters[1]:
            # New, or its counters went back: a pod made anew under the same name.
            return _Seen(counters, None, now, counters[0], None, since_throttled_ns=counters[1])
        entry = before
        if counters != entry.counters:
            if not entry.wanted:
                # It starts to want the GPU: its use is measured from now. A window that held
                # its idle time read a pod that woke at 70 % as 35, which gave a bursting pod
                # beside it the rest, which held it there: it gained 5 points a pass.
                entry.since_ns, entry.since_gpu_ns, entry.used = now, counters[0], None
                entry.since_throttled_ns = counters[1]
            entry.counters = counters
            entry.moved_ns = now
        elapsed = now - entry.since_ns
        if entry.used is not None:
            due = elapsed >= USE_WINDOW_NS
        else:
            # A first measurement holds at least one move of its counters after the one that
            # woke it (an epoch ended): a pod at 10 % ends one every 320 ms, and a quarter
            # second without one read it as 0.
            moved_since = entry.moved_ns is not None and entry.moved_ns > entry.since_ns
            due = elapsed >= FIRST_USE_WINDOW_NS and moved_since
        if due:
            used = max(0, counters[0] - entry.since_gpu_ns) * WHOLE_GPU // elapsed
            entry.used = min(WHOLE_GPU, used)
            waited = max(0, counters[1] - entry.since_throttled_ns) * WHOLE_GPU // elapsed
            entry.waited = min(WHOLE_GPU, waited)
            entry.since_ns, entry.since_gpu_ns = now, counters[0]
            entry.since_throttled_ns = counters[1]
        return entry
