"""Which pods want each GPU now, for the scheduling policy (scheduler.py): a GPU is divided among
the pods that use it, never among pods that merely exist.

A pod wants a GPU when, since the node's previous pass, its GPU time on it grew (it launched work)
or its waiting time did (its launches waited for their share or for the lease): both counters are
in its region's device entry, kept by its own processes, and it must have a live process. A pod
made and never used, one whose processes exited or sleep on the CPU, a frozen pod: none of them
takes anything from the others.

The window is the pass (a second at most): a pod that starts launching again runs at its own
limit until the next pass weighs it in.

The counters are the tenant's to write: a pod that stops its own to look idle keeps its own
limit where it would have been scaled down, never more than that limit (the lease still divides
the GPU's time between the pods that run)."""

from collections.abc import Iterable

from vgpu_hypervisor.daemon.pods import PodKey, PodRecord

DeviceKey = tuple[PodKey, int]  # a pod and the index of its device entry


class DemandTracker:
    """The pods' counters at the previous pass, and from them who wants each GPU now."""

    def __init__(self) -> None:
        self._last: dict[DeviceKey, tuple[int, int]] = {}

    def wanting(self, records: Iterable[PodRecord]) -> set[DeviceKey]:
        """The (pod, device entry) pairs of pods with a live process whose GPU time or waiting
        time moved since the last call; a pair seen for the first time wants the GPU when its
        pod has a live process (no earlier count to compare with)."""
        seen: dict[DeviceKey, tuple[int, int]] = {}
        wanting: set[DeviceKey] = set()
        for record in records:
            if record.error is not None:
                continue
            for device in record.devices:
                key = (record.key, device.index)
                counters = (device.gpu_ns, device.throttled_ns)
                seen[key] = counters
                before = self._last.get(key)
                # No live process: none launches or waits now, whatever moved before it went.
                if record.processes and (before is None or counters != before):
                    wanting.add(key)
        self._last = seen
        return wanting
