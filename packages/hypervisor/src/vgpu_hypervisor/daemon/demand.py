"""Which pods want each GPU now, and how much of it they use, for the scheduling policy
(scheduler.py): a GPU is divided among the pods that use it, never among pods that merely exist,
and a pod with a soft limit takes what the others leave.

A pod wants a GPU when, since the node's previous pass, its GPU time on it grew (it launched work)
or its waiting time did (its launches waited for their share or for the lease): both counters are
in its region's device entry, kept by its own processes, and it must have a live process. A pod
made and never used, one whose processes exited or sleep on the CPU, a frozen pod: none of them
takes anything from the others. Its use is its GPU time over the pass's wall time.

The window is the pass (a second at most): a pod that starts launching again runs at its own
limit until the next pass weighs it in.

The counters are the tenant's to write: a pod that stops its own to look idle keeps its own
limit where it would have been scaled down, never more than that limit (the lease still divides
the GPU's time between the pods that run)."""

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vgpu_common.limits import WHOLE_GPU

from vgpu_hypervisor.daemon.pods import PodKey, PodRecord

DeviceKey = tuple[PodKey, int]  # a pod and the index of its device entry


@dataclass(frozen=True)
class Demand:
    """One pass's reading: who wants each GPU, and what each used (hundredths of the GPU over
    the pass; absent on a pod's first pass)."""

    wanting: set[DeviceKey] = field(default_factory=set)
    usage: dict[DeviceKey, int] = field(default_factory=dict)


class DemandTracker:
    """The pods' counters at the previous pass, and from them who wants each GPU now."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock
        self._last: dict[DeviceKey, tuple[int, int]] = {}
        self._last_ns = 0

    def observe(self, records: Iterable[PodRecord]) -> Demand:
        """Compare the pods' counters with the last call's. A pair seen for the first time
        wants the GPU when its pod has a live process (no earlier count to compare with)."""
        now = self._clock()
        interval = now - self._last_ns if self._last_ns else 0
        seen: dict[DeviceKey, tuple[int, int]] = {}
        demand = Demand()
        for record in records:
            if record.error is not None:
                continue
            for device in record.devices:
                key = (record.key, device.index)
                counters = (device.gpu_ns, device.throttled_ns)
                seen[key] = counters
                before = self._last.get(key)
                # No live process: none launches or waits now, whatever moved before it went.
                if not record.processes or counters == before:
                    continue
                demand.wanting.add(key)
                if before is None or interval <= 0:
                    continue
                used = max(0, counters[0] - before[0]) * WHOLE_GPU // interval
                demand.usage[key] = min(WHOLE_GPU, used)
        self._last = seen
        self._last_ns = now
        return demand
