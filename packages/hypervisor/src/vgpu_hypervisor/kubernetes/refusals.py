"""OutOfGpuMemory events: a Kubernetes pod whose allocations the limiter refused at its memory
limit is told so on the pod (`kubectl describe pod`), since the workload itself often only
says "out of memory" without the limit that caused it.

Each new view of the node is compared with the last: a device entry whose refusal count grew
gets an event naming the GPU, the limit and the size of the last refused allocation. Events
go out at most once a minute per pod; refusals in between are told in the next one, with how
many there were. A count already there when the daemon first sees a region (refusals from
before it started) is not reported.
"""

from __future__ import annotations

import logging
import time

from vgpu_common.limits import format_size

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.node import NodeView
from vgpu_hypervisor.kubernetes.events import EventPoster
from vgpu_hypervisor.kubernetes.identity import PodLookup

log = logging.getLogger("vgpu_hypervisor.kubernetes")
REASON = "OutOfGpuMemory"

_Key = tuple[str, str, str]  # namespace, pod, GPU UUID (lower case)


class RefusalReporter:
    """Watches the node's views (a Node watcher) and posts OutOfGpuMemory events."""

    def __init__(self, pods: PodLookup, events: EventPoster) -> None:
        self._pods = pods
        self._events = events
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
                elif gpu.oom_refusals > told and self._tell(pod, gpu, gpu.oom_refusals - told):
                    told = gpu.oom_refusals
                reported[key] = told
        self._reported = reported

    def _tell(self, pod: models.Pod, gpu: models.PodGpu, new: int) -> bool:
        """Whether the refusals are told (or there is no Kubernetes pod to tell them to)."""
        kube = self._pods.by_key(pod.namespace, pod.name)
        if kube is None:
            return True  # a pod made through the API: its counter says it all
        where = f"GPU {gpu.index} ({gpu.uuid})" if gpu.index is not None else f"GPU {gpu.uuid}"
        limit = (
            f"its memory limit of {format_size(gpu.memory_limit)}"
            if gpu.memory_limit
            else "its memory limit (removed since)"
        )
        size = (
            f"; the last asked for {format_size(gpu.last_refused_bytes)}"
            if (gpu.last_refused_bytes)
            else ""
        )
        allocations = "an allocation" if new == 1 else f"{new} allocations"
        message = (
            f"pod {pod.namespace}/{pod.name}: {allocations} refused on {where}: past {limit}"
            f"{size} (the pod holds {format_size(gpu.memory_used)} there)"
        )
        if not self._events.post(kube, REASON, message, per_pod=True):
            return False
        log.warning("%s", message)
        return True
