"""Allocations the limit refused, told: a program whose allocation a pod's memory limit refused
often says only "out of memory", without the limit that caused it.

Each new view of the node is compared with the last: a device entry whose refusal count grew is
told, naming the GPU, the limit and the size of the last refused allocation, by whatever tells
(``Tell``: a Kubernetes event on the pod, or a warning in the daemon's log). A tell may decline
(said too recently): the refusals are then told with the next ones, with how many there were. A
count already there when the daemon first sees a region (refusals from before it started) is not
told.
"""

import logging
import time
from collections.abc import Callable

from vgpu_common.limits import format_size

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.node import NodeView

log = logging.getLogger("vgpu_hypervisor")
QUIET_S = 60.0  # a pod's refusals go to the log at most this often

_Key = tuple[str, str, str]  # namespace, pod, GPU UUID (lower case)
# Tell the pod's refusals in this message; whether they were told (False: not now, try later).
Tell = Callable[[models.Pod, str], bool]


def refusal_message(pod: models.Pod, gpu: models.PodGpu, new: int) -> str:
    """One line: how many allocations were refused where, at which limit."""
    where = f"GPU {gpu.index} ({gpu.uuid})" if gpu.index is not None else f"GPU {gpu.uuid}"
    limit = (
        f"its memory limit of {format_size(gpu.memory_limit)}"
        if gpu.memory_limit
        else "its memory limit (removed since)"
    )
    size = (
        f"; the last asked for {format_size(gpu.last_refused_bytes)}"
        if gpu.last_refused_bytes
        else ""
    )
    allocations = "an allocation" if new == 1 else f"{new} allocations"
    return (
        f"pod {pod.namespace}/{pod.name}: {allocations} refused on {where}: past {limit}"
        f"{size} (the pod holds {format_size(gpu.memory_used)} there)"
    )


class RefusalReporter:
    """Watches the node's views (a Node watcher) and tells each pod's new refusals."""

    def __init__(self, tell: Tell) -> None:
        self._tell = tell
        self._started = time.time()
        self._reported: dict[_Key, int] = {}  # the count last told (or first seen)

    def observe(self, view: NodeView) -> None:
        reported: dict[_Key, int] = {}
        for pod in view.pods:
            # A region made since the daemon started has all its refusals still to tell.
            fresh = pod.created is not None and pod.created >= self._started
            for gpu in pod.gpus:
                key = (pod.namespace, pod.name, gpu.uuid.lower())
                told = self._reported.get(key, 0 if fresh else gpu.oom_refusals)
                if gpu.oom_refusals < told:
                    told = gpu.oom_refusals  # a new region under the same name
                elif gpu.oom_refusals > told and self._tell(
                    pod, refusal_message(pod, gpu, gpu.oom_refusals - told)
                ):
                    told = gpu.oom_refusals
                reported[key] = told
        self._reported = reported


class RefusalLog:
    """Tells refusals as a warning in the daemon's log, at most once every QUIET_S per pod (the
    refusals in between come with the next one)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}

    def __call__(self, pod: models.Pod, message: str) -> bool:
        now = self._clock()
        last = self._last.get((pod.namespace, pod.name))
        if last is not None and now - last < QUIET_S:
            return False
        self._last[(pod.namespace, pod.name)] = now
        log.warning("%s", message)
        return True
