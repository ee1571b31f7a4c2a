"""OutOfGpuMemory events: a Kubernetes pod whose allocations the limiter refused at its memory
limit is told so on the pod (`kubectl describe pod`), since the workload itself often only
says "out of memory" without the limit that caused it. Events go out at most once a minute per
pod (the event poster's rule); refusals in between are told in the next one. A pod made through
the API, with no Kubernetes pod to tell, is told in the daemon's log (daemon/refusals.py).
"""

from __future__ import annotations

import logging

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.refusals import RefusalLog
from vgpu_hypervisor.kubernetes.events import EventPoster
from vgpu_hypervisor.kubernetes.identity import PodLookup

log = logging.getLogger("vgpu_hypervisor.kubernetes")
REASON = "OutOfGpuMemory"


class KubernetesRefusals:
    """A daemon.refusals Tell: an event on the pod's Kubernetes pod, else the daemon's log."""

    def __init__(self, pods: PodLookup, events: EventPoster, fallback: RefusalLog) -> None:
        self._pods = pods
        self._events = events
        self._fallback = fallback

    def __call__(self, pod: models.Pod, message: str) -> bool:
        kube = self._pods.by_key(pod.namespace, pod.name)
        if kube is None:
            return self._fallback(pod, message)
        if not self._events.post(kube, REASON, message, per_pod=True):
            return False
        log.warning("%s", message)
        return True
