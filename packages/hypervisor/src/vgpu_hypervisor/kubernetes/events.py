"""Kubernetes Events on a pod (`kubectl describe pod` shows them): what is wrong with its limits.

Posting is fire-and-forget on the daemon's event loop, callable from any thread; the same
(pod, reason, message) is posted at most once per ``interval_s``, so a pod whose annotations
stay wrong, seen again at every re-list, does not flood the API server; events whose message
changes every time (a count, a size) are limited per (pod, reason) instead.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from lightkube import AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

from vgpu_hypervisor.kubernetes.model import KubePod

log = logging.getLogger("vgpu_hypervisor.kubernetes")
COMPONENT = "tf-hypervisor"
_KEEP = 4096  # rate-limit entries kept before old ones are dropped


class EventPoster:
    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        loop: asyncio.AbstractEventLoop,
        *,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._node = node_name
        self._loop = loop
        self._interval = interval_s
        self._clock = clock
        self._last: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def post(self, pod: KubePod, reason: str, message: str, *, per_pod: bool = False) -> bool:
        """Post a Warning event on ``pod`` unless the same one went out lately (with
        ``per_pod``, any event of that reason on the pod: for messages that change each
        time); whether it was sent. Thread-safe."""
        key = (pod.uid, reason, "" if per_pod else message)
        now = self._clock()
        with self._lock:
            if now - self._last.get(key, -self._interval) < self._interval:
                return False
            self._last[key] = now
            if len(self._last) > _KEEP:
                cutoff = now - self._interval
                self._last = {k: t for k, t in self._last.items() if t >= cutoff}
        self._loop.call_soon_threadsafe(self._start, pod, reason, message)
        return True

    def _start(self, pod: KubePod, reason: str, message: str) -> None:
        task = self._loop.create_task(self._send(pod, reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, pod: KubePod, reason: str, message: str) -> None:
        now = datetime.now(UTC)
        event = Event(
            metadata=ObjectMeta(generateName=f"{pod.name}.", namespace=pod.namespace),
            involvedObject=ObjectReference(
                apiVersion="v1", kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid
            ),
            reason=reason,
            message=message[:1024],
            type="Warning",
            source=EventSource(component=COMPONENT, host=self._node),
            reportingComponent=COMPONENT,
            reportingInstance=self._node,
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        try:
            await self._client.create(event)
        except Exception as error:  # the API server away: the log line stays
            log.warning(
                "cannot post the event %s on pod %s: %s: %s",
                reason,
                pod.key,
                type(error).__name__,
                " ".join(str(error).split()),
            )

    async def drain(self) -> None:
        """Wait for the events being sent."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
