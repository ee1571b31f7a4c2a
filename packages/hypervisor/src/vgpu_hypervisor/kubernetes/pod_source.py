"""The pods of this node, from the API server, kept in the daemon's PodStore.

List, then watch from the list's resourceVersion, with ``spec.nodeName=NODE_NAME``. A watch
that ends (the server closing it) is resumed from the last version seen; 410 Gone, or any
error, starts again from a fresh list after a pause that doubles up to a bound, so a server
that is down costs one attempt per pause, never a busy loop. Meanwhile the regions stay as
they are: limits keep being enforced by the limiter, which needs no daemon.

A pod that asks for a vgpu share (annotations or resources) gets its region with its limits;
changed annotations change them in place; a pod deleted, or finished, has its region deleted
(kept, marked deleted, while its workers live: the store removes it after the last exits).
Regions made here carry a marker file with the pod's UID, so a fresh list also removes those
of pods deleted while the daemon was away, and leaves regions made through the API alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Any

from lightkube import ALL_NS, AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod
from vgpu_common.units import format_size

from vgpu_hypervisor.daemon.pods import Limits, PodError, PodNotFound, PodStore
from vgpu_hypervisor.daemon.scheduler import QOS_BY_NAME
from vgpu_hypervisor.kubernetes.annotations import (
    DEFAULT_NAMES,
    NodeGpu,
    Resolution,
    ResourceNames,
    resolve,
)
from vgpu_hypervisor.kubernetes.events import EventPoster
from vgpu_hypervisor.kubernetes.model import KubeContainer, KubePod

log = logging.getLogger("vgpu_hypervisor.kubernetes")
MARKER = "kubernetes-pod"  # in a pod's folder: the UID of the Kubernetes pod it was made for
_FINISHED = ("Succeeded", "Failed")
_WATCH_SERVER_TIMEOUT_S = 300  # the server ends a watch after this; it is resumed at once


class Backoff:
    """Pauses that double from ``first`` up to ``most`` seconds; ``reset`` after a success."""

    def __init__(self, first: float = 0.5, most: float = 30.0) -> None:
        self.first = first
        self.most = max(first, most)
        self._next = first

    def next(self) -> float:
        pause = self._next
        self._next = min(self.most, self._next * 2)
        return pause

    def reset(self) -> None:
        self._next = self.first


def kube_pod(obj: Any) -> KubePod:
    """A lightkube Pod as the daemon keeps it."""
    meta, spec, status = obj.metadata, obj.spec, obj.status
    statuses = {s.name: s for s in (status.containerStatuses or [])} if status else {}
    containers = []
    for container in spec.containers if spec else []:
        resources: dict[str, str] = {}
        if container.resources is not None:
            resources |= {k: str(v) for k, v in (container.resources.requests or {}).items()}
            resources |= {k: str(v) for k, v in (container.resources.limits or {}).items()}
        state = statuses.get(container.name)
        container_id = (state.containerID or "") if state else ""
        containers.append(
            KubeContainer(
                name=container.name,
                resources=resources,
                container_id=container_id.partition("://")[2] or container_id,
                running=bool(state and state.state and state.state.running),
            )
        )
    created = meta.creationTimestamp
    return KubePod(
        namespace=meta.namespace or "default",
        name=meta.name or "",
        uid=meta.uid or "",
        node_name=(spec.nodeName or "") if spec else "",
        phase=(status.phase or "Unknown") if status else "Unknown",
        resource_version=meta.resourceVersion or "",
        created=created.isoformat() if isinstance(created, datetime) else str(created or ""),
        annotations=dict(meta.annotations or {}),
        containers=tuple(containers),
        deleting=meta.deletionTimestamp is not None,
    )


class PodSource:
    """Keeps the store's regions in step with the pods of ``node_name``; its cache of those
    pods answers the device plugin (``pending``) and the worker identity (``by_uid``)."""

    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        store: PodStore,
        gpus: Callable[[], Sequence[NodeGpu]],
        *,
        names: ResourceNames = DEFAULT_NAMES,
        events: EventPoster | None = None,
        changed: Callable[[], object] = lambda: None,  # called in a worker thread
        backoff: Backoff | None = None,
    ) -> None:
        self._client = client
        self.node_name = node_name
        self._store = store
        self._gpus = gpus
        self._names = names
        self._events = events
        self._changed = changed
        self._backoff = backoff or Backoff()
        self._pods: dict[str, KubePod] = {}  # by UID
        self._reported: dict[str, tuple[str, ...]] = {}  # problems last logged, by UID
        self._assigned: dict[str, tuple[str, ...]] = {}  # GPUs the device plugin gave, by UID
        self.synced = asyncio.Event()  # set after each successful list

    # What the device plugin and the identity lookup ask

    def pods(self) -> list[KubePod]:
        return list(self._pods.values())

    def by_uid(self, uid: str) -> KubePod | None:
        return self._pods.get(uid)

    def by_key(self, namespace: str, name: str) -> KubePod | None:
        # A copy: the daemon's refresh thread asks while the event loop changes the dict.
        pods = tuple(self._pods.values())
        return next((p for p in pods if (p.namespace, p.name) == (namespace, name)), None)

    def pending(self) -> list[KubePod]:
        """Pods of this node not yet running that ask for vgpu resources, oldest first."""
        wanted = (self._names.gpu, self._names.memory, self._names.compute)
        return sorted(
            (
                pod
                for pod in self._pods.values()
                if pod.phase == "Pending"
                and not pod.deleting
                and any(name in c.resources for c in pod.containers for name in wanted)
            ),
            key=lambda pod: (pod.created, pod.key),
        )

    def assign(self, uid: str, gpus: Sequence[str]) -> None:
        """Record the GPUs (indices or UUIDs) the device plugin gave a pod, and set its limits
        on them (blocking; thread-safe: the store is). A pod's gpu-ids annotation wins."""
        self._assigned[uid] = tuple(gpus)
        pod = self._pods.get(uid)
        if pod is not None:
            self._handle("MODIFIED", pod)

    # The loop

    async def run(self) -> None:
        """List and watch for ever (until cancelled)."""
        while True:
            try:
                version = await self._list()
                self._backoff.reset()
                await self._watch(version)
            except asyncio.CancelledError:
                raise
            except ApiError as error:
                if error.status.code == 410:
                    log.info("watch expired (410 Gone); listing the pods again")
                    continue
                await self._pause(f"API server: {error.status.code} {error.status.message}")
            except Exception as error:  # any transport or decoding failure: retry later
                await self._pause(f"API server: {type(error).__name__}: {error}")

    async def _pause(self, why: str) -> None:
        pause = self._backoff.next()
        log.warning("%s; listing the pods again in %g s", " ".join(why.split()), pause)
        await asyncio.sleep(pause)

    async def _list(self) -> str:
        listing = self._client.list(Pod, namespace=ALL_NS, fields={"spec.nodeName": self.node_name})
        pods = [kube_pod(obj) async for obj in listing]
        version = str(listing.resourceVersion)
        gone = set(self._pods) - {pod.uid for pod in pods}
        self._pods = {pod.uid: pod for pod in pods if pod.node_name == self.node_name}
        for uid in gone:
            self._reported.pop(uid, None)
            self._assigned.pop(uid, None)
        await asyncio.to_thread(self._reconcile, list(self._pods.values()))
        log.info("%d pod(s) on node %s (resourceVersion %s)", len(pods), self.node_name, version)
        self.synced.set()
        return version

    async def _watch(self, version: str) -> None:
        events = self._client.watch(
            Pod,
            namespace=ALL_NS,
            fields={"spec.nodeName": self.node_name},
            resource_version=version,
            server_timeout=_WATCH_SERVER_TIMEOUT_S,
        )
        stream = aiter(events)
        while True:
            # A watch has no read timeout and the server ends it after a while: one that says
            # nothing for twice that long sits on a dead connection (a partition the server
            # never saw close), so it is given up for a fresh list.
            try:
                kind, obj = await asyncio.wait_for(anext(stream), 2 * _WATCH_SERVER_TIMEOUT_S)
            except StopAsyncIteration:
                return
            except TimeoutError:
                log.info(
                    "watch silent for %d s; listing the pods again", 2 * _WATCH_SERVER_TIMEOUT_S
                )
                return
            pod = kube_pod(obj)
            if pod.node_name != self.node_name:
                continue  # moved, or a server that ignored the selector
            if kind == "DELETED":
                self._pods.pop(pod.uid, None)
                self._reported.pop(pod.uid, None)
                self._assigned.pop(pod.uid, None)
            else:
                self._pods[pod.uid] = pod
            await asyncio.to_thread(self._handle, kind, pod)

    # Keeping the store in step (blocking: in a worker thread)

    def _handle(self, kind: str, pod: KubePod) -> None:
        if kind == "DELETED":
            self._remove(pod, "pod deleted")
        else:
            self._apply(pod)
        self._changed()

    def _reconcile(self, pods: Iterable[KubePod]) -> None:
        """After a list: every pod applied, the regions made for pods now gone removed."""
        present = {pod.key: pod for pod in pods}
        for pod in present.values():
            self._apply(pod)
        for record in self._store.scan():
            key = f"{record.namespace}/{record.name}"
            uid = _marker(record.path)
            if uid and key not in present:
                self._delete(record.namespace, record.name, why="no longer on this node")
        self._changed()

    def _apply(self, pod: KubePod) -> None:
        if pod.deleting or pod.phase in _FINISHED:
            self._remove(pod, "pod terminating" if pod.deleting else f"pod {pod.phase.lower()}")
            return
        found = resolve(pod, self._gpus(), self._names, self._assigned.get(pod.uid, ()))
        self._report(pod, found)
        if not found.wants_gpu:
            self._remove(pod, "the pod asks for no vgpu share now")
            return
        if not found.gpus:
            return  # nothing usable: problems reported, the region (if any) kept as it is
        limits = {
            uuid: Limits(
                memory=gpu.memory or 0,
                compute=100.0 if gpu.compute is None else gpu.compute,
                oversubscribe=found.oversubscribe,
                burst=gpu.burst or 0,
            )
            for uuid, gpu in found.gpus.items()
        }
        try:
            try:
                record = self._store.get(pod.namespace, pod.name)
            except PodNotFound:
                record = self._store.create(pod.namespace, pod.name, limits)
                log.info("pod %s: region created: %s", pod.key, _describe(found))
            else:
                before = {d.uuid.lower(): d.limits for d in record.devices}
                record = self._store.update(pod.namespace, pod.name, limits)
                after = {d.uuid.lower(): d.limits for d in record.devices}
                if before != after:
                    log.info("pod %s: limits changed: %s", pod.key, _describe(found))
            # The class from tensor-fusion.ai/qos (medium without it); the weight stays the API's.
            self._store.set_policy(
                pod.namespace, pod.name, QOS_BY_NAME[found.qos or "medium"], None
            )
            marker = record.path.parent / MARKER
            if _marker(record.path) != pod.uid:
                marker.write_text(pod.uid + "\n")
        except (PodError, OSError) as error:
            message = f"pod {pod.key}: cannot set its limits: {error}"
            log.error("%s", message)
            if self._events is not None:
                self._events.post(pod, "LimitsFailed", message)

    def _report(self, pod: KubePod, found: Resolution) -> None:
        """Problems are logged when they change and posted as events (rate-limited)."""
        if self._reported.get(pod.uid) != found.problems:
            for problem in found.problems:
                log.warning("%s", problem)
            self._reported[pod.uid] = found.problems
        if self._events is not None:
            for problem in found.problems:
                self._events.post(pod, "InvalidLimits", problem)

    def _remove(self, pod: KubePod, why: str) -> None:
        try:
            record = self._store.get(pod.namespace, pod.name)
        except PodError:
            return
        if _marker(record.path) == pod.uid:
            self._delete(pod.namespace, pod.name, why=why)

    def _delete(self, namespace: str, name: str, *, why: str) -> None:
        try:
            record = self._store.delete(namespace, name, force=True)
        except PodError as error:
            log.error("pod %s/%s: cannot delete its region: %s", namespace, name, error)
            return
        live = sum(1 for _ in record.processes)
        log.info(
            "pod %s/%s: region deleted (%s)%s",
            namespace,
            name,
            why,
            f"; kept until its {live} worker(s) exit" if live else "",
        )


def _marker(region: Path) -> str | None:
    with suppress(OSError, UnicodeDecodeError):
        return (region.parent / MARKER).read_text().strip() or None
    return None


def _describe(found: Resolution) -> str:
    parts = []
    for uuid, gpu in found.gpus.items():
        memory = format_size(gpu.memory) if gpu.memory else "no memory limit"
        compute = f"{gpu.compute:g} %" if gpu.compute is not None else "no compute limit"
        parts.append(f"{uuid} {memory}, {compute}")
    return "; ".join(parts)
