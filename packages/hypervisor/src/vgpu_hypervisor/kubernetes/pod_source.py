"""The pods of this node, from the API server, kept in the daemon's PodStore.

List, then watch from the list's resourceVersion, with ``spec.nodeName=NODE_NAME``. A watch
that ends (the server closing it) is resumed from the last version seen; 410 Gone, or any
error, starts again from a fresh list after a pause that doubles up to a bound, so a server
that is down costs one attempt per pause, never a busy loop. Meanwhile the regions stay as
they are: limits keep being enforced by the limiter, which needs no daemon.

A pod that asks for a vgpu share (annotations or resources) gets its region with its limits
(resolver.py: resources the ceiling, annotations only lower it); changed annotations change
them in place; a pod deleted, or finished, has its region deleted (kept, marked deleted, while
its workers live: the store removes it after the last exits). What the pod source made is in
its book (pod_book.py), in a folder only the daemon writes, never in the tenant's pod folder:
a fresh list also removes the regions of pods deleted while the daemon was away, and leaves
regions made through the API alone; a limit changed through the API stays the pod's ceiling.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from lightkube import ALL_NS, AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod
from vgpu_common.limits import (
    Qos,
    format_percent,
    format_size,
    hundredths_to_percent,
    known,
)
from vgpu_limiter.region import DeviceInfo, DeviceLimits

from vgpu_hypervisor.daemon.pods import PodError, PodNotFound, PodRecord, PodStore
from vgpu_hypervisor.kubernetes.annotations import (
    DEFAULT_NAMES,
    PREFIX,
    QOS,
    NodeGpu,
    ResourceNames,
    match_gpu,
)
from vgpu_hypervisor.kubernetes.events import EventPoster
from vgpu_hypervisor.kubernetes.model import KubeContainer, KubePod, UserGroup
from vgpu_hypervisor.kubernetes.pod_book import Entry, PodBook, Written, forget_old_marker
from vgpu_hypervisor.kubernetes.requests import effective_requests
from vgpu_hypervisor.kubernetes.resolver import Ceiling, GpuCeiling, Resolution, resolve

log = logging.getLogger("vgpu_hypervisor.kubernetes")
# What set a ceiling, in refusals ("…, the ceiling from {source}") and the book.
_ADMIN = "the limit set through the API"
_STARTED = "the pod's first annotations (it asks for no vgpu resource)"
_BY_ADMIN = "through the API: annotations may lower it, not raise it"
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
    found = (
        []
        if status is None
        else [*(status.initContainerStatuses or []), *(status.containerStatuses or [])]
    )
    statuses = {s.name: s for s in found}
    containers = []
    # Init containers too: one (a sidecar above all) may ask for a vgpu share (requests.py).
    listed = [
        *((c, True) for c in ((spec.initContainers or []) if spec else [])),
        *((c, False) for c in (spec.containers if spec else [])),
    ]
    for container, init in listed:
        resources: dict[str, str] = {}
        claims: tuple[str, ...] = ()
        if container.resources is not None:
            claims = tuple(c.name for c in container.resources.claims or [])
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
                run_as=_run_as(container.securityContext),
                init=init,
                sidecar=init and container.restartPolicy == "Always",
                claims=claims,
            )
        )
    created = meta.creationTimestamp
    security = spec.securityContext if spec else None
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
        run_as=_run_as(security),
        fs_group=security.fsGroup if security is not None else None,
        dra_claims=bool(spec and spec.resourceClaims)
        or bool(status and status.extendedResourceClaimStatus),
        claim_objects=_claim_objects(spec, status),
    )


def _claim_objects(spec: Any, status: Any) -> dict[str, str]:
    """Each pod claim's ResourceClaim: named in the spec, else made for it (the status)."""
    named = {
        c.name: c.resourceClaimName
        for c in ((status.resourceClaimStatuses or []) if status else [])
        if c.resourceClaimName
    }
    named |= {
        c.name: c.resourceClaimName
        for c in ((spec.resourceClaims or []) if spec else [])
        if c.resourceClaimName
    }
    return named


def _run_as(security: Any) -> UserGroup:
    """runAsUser and runAsGroup of a pod's or a container's securityContext (None: absent)."""
    if security is None:
        return UserGroup()
    return UserGroup(security.runAsUser, security.runAsGroup)


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
        book: PodBook | None = None,
        tenant_raise: bool = False,
        plugin_places: bool = False,
        dra_places: bool = False,
    ) -> None:
        """``book``: what the pod source made, by default under the store's base path
        (BookError when that folder is not the daemon's own). ``tenant_raise`` (a setting):
        a pod with annotations alone may raise its limits by editing them; off, the limits it
        started with are its ceiling. ``plugin_places``: the daemon's device plugin gives the
        GPUs of the pods asking for the GPU resource, so such a pod's region waits for them
        (``assign``) and holds only them, rather than every GPU of the node. ``dra_places``:
        the daemon's DRA driver gives GPUs through ResourceClaims, and the region of a pod
        that references one is the driver's (``_from_dra``)."""
        self._client = client
        self.node_name = node_name
        self._store = store
        self._gpus = gpus
        self._names = names
        self._events = events
        self._changed = changed
        self._backoff = backoff or Backoff()
        self._book = book or PodBook(store.base)
        self._tenant_raise = tenant_raise
        self._plugin_places = plugin_places
        self._dra_places = dra_places
        # One change of the store and the book at a time: the watch's worker thread and the
        # device plugin's Allocate (assign) both apply pods.
        self._lock = threading.RLock()
        self._pods: dict[str, KubePod] = {}  # by UID
        self._reported: dict[str, tuple[str, ...]] = {}  # problems last logged, by UID
        self._assigned: dict[str, tuple[str, ...]] = {}  # GPUs the device plugin gave, by UID
        # Set by the daemon once its device plugin and DRA driver are built, before ``run``:
        # the GPUs the plugin's bindings gave a pod (kept across restarts), and those its
        # prepared ResourceClaims hold (the driver's checkpoint), by pod UID.
        self.plugin_gpus: Callable[[str], Sequence[str]] | None = None
        self.claim_gpus: Callable[[str], Collection[str]] = lambda uid: ()
        self.synced = asyncio.Event()  # set after each successful list
        # Why the API server cannot be followed now (the daemon is not ready), None while it is.
        self.problem: str | None = "the pods not listed yet"
        store.admin_listeners.append(self._admin_changed)

    def region_made_for(self, namespace: str, name: str) -> str | None:
        """The UID of the pod the source made the region of ``namespace/name`` for; None when
        it made none. Read without the lock (one dict lookup), as the DRA driver asks while
        it holds its own."""
        entry = self._book.get(namespace, name)
        return None if entry is None else entry.uid

    def _admin_changed(self, namespace: str, name: str) -> None:
        """The API changed a pod's limits: book the admin's change now (it becomes the pod's
        ceiling, kept across restarts) rather than at the pod's next event."""
        pod = self.by_key(namespace, name)
        if pod is None:
            return
        with self._lock:
            try:
                self._apply(pod)
            except Exception as error:  # the API's change is made: the API must not fail
                log.warning(
                    "pod %s: the admin's change is booked at its next event: %s", pod.key, error
                )

    # What the device plugin and the identity lookup ask

    def pods(self) -> list[KubePod]:
        return list(self._pods.values())

    def live_uids(self) -> set[str] | None:
        """The UIDs of this node's pods that have not ended, whose devices the kubelet still
        holds for them; None before the first list (not known yet)."""
        if not self.synced.is_set():
            return None
        return {uid for uid, pod in tuple(self._pods.items()) if pod.phase not in _FINISHED}

    @property
    def events(self) -> EventPoster | None:
        return self._events

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
        """Record the GPUs (indices or UUIDs) the device plugin gave a pod's container, and set
        the pod's limits on them and those its other containers were given (blocking;
        thread-safe: the store is). They win over a gpu-ids annotation naming others."""
        with self._lock:
            # Added to the pod's other containers' (the binder binds one container at a
            # time). Before, each replaced the last: a 2-container pod's annotations reached
            # only the GPU bound last, and a pod made again over a file its deleted namesake's
            # workers still used (which lists both GPUs) was refused for good, each container
            # asking for fewer GPUs than the file lists.
            known = self._assigned.get(uid, ())
            self._assigned[uid] = (*known, *(gpu for gpu in gpus if gpu not in known))
        self.claim_left(uid)

    def claim_left(self, uid: str) -> None:
        """Apply the pod again (blocking; thread-safe). Called too when one of its
        ResourceClaims was unprepared while others stay: the claim's GPUs are released in the
        region, a GPU the device plugin gave the pod too among them, whose limits this writes
        again."""
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
        self.problem = " ".join(why.split())
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
        self.problem = None
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
            # never saw close), so it is given up for a fresh list. asyncio.timeout, not
            # wait_for: Python 3.11's wait_for returns the event and drops a cancellation that
            # comes as the event does, and the daemon then did not stop on SIGTERM.
            try:
                async with asyncio.timeout(2 * _WATCH_SERVER_TIMEOUT_S):
                    kind, obj = await anext(stream)
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

    # Keeping the store in step (blocking: in a worker thread, or the device plugin's)

    def _handle(self, kind: str, pod: KubePod) -> None:
        with self._lock:
            if kind == "DELETED":
                self._remove(pod, "pod deleted")
            else:
                self._apply(pod)
        self._changed()

    def _reconcile(self, pods: Iterable[KubePod]) -> None:
        """After a list: every pod applied, the regions made for pods now gone removed."""
        with self._lock:
            present = {(pod.namespace, pod.name): pod for pod in pods}
            for pod in present.values():
                self._drop_namesakes(pod)
                self._apply(pod)
            for namespace, name in self._book.pods():
                if (namespace, name) not in present:
                    self._delete(namespace, name, why="no longer on this node")
        self._changed()

    def _drop_namesakes(self, pod: KubePod) -> None:
        """Delete the region made for an earlier pod of this pod's name (a StatefulSet's pod
        deleted and made again while no watch followed), so that this pod's is made afresh.
        Before, the list applied the new pod over it: the old pod's GPUs stayed in the new
        pod's region with their limits. Left as it is while processes use it (the new pod's,
        bound meanwhile, or the old pod's still), or where the pod's claims hold GPUs in it
        (the DRA driver's region: its Unprepare sees to the old claims)."""
        entry = self._book.get(pod.namespace, pod.name)
        if entry is None or entry.uid == pod.uid or self.claim_gpus(pod.uid):
            return
        try:
            self._store.delete(pod.namespace, pod.name)
        except PodNotFound:
            pass
        except PodError as error:  # live workers: the region stays, taken over as before
            log.info("pod %s: the region of its namesake (UID %s) stays: %s", pod.key, entry.uid,
                     error)  # fmt: skip
            return
        self._book.remove(pod.namespace, pod.name)
        log.info("pod %s: region of its namesake (UID %s) deleted", pod.key, entry.uid)

    def _apply(self, pod: KubePod) -> None:
        if pod.deleting or pod.phase in _FINISHED:
            self._remove(pod, "pod terminating" if pod.deleting else f"pod {pod.phase.lower()}")
            return
        if self._from_dra(pod):
            return
        entry = self._entry(pod)
        record = self._region(pod)
        if entry is not None and record is not None:
            admin = self._store.admin_limits(pod.namespace, pod.name)
            entry = _admin_changes(pod, entry, record, admin)
        assigned = self._plugin_given(pod, record)
        if assigned is None:
            return  # its region comes when the kubelet gives it GPUs (assign)
        found = resolve(
            pod,
            self._gpus(),
            self._names,
            assigned,
            ceilings=entry.ceilings if entry is not None else None,
        )
        self._report(pod, found)
        if not found.wants_gpu or not found.gpus:
            return  # nothing asked, or nothing usable: problems reported, the region as it is
        limits = found.limits(keep_burst=entry.admin_burst if entry is not None else frozenset())
        try:
            if record is None:
                owner = found.owner  # fixed for the pod's life: a pod's spec cannot change it
                self._store.create(
                    pod.namespace, pod.name, limits, owner=owner.user, group=owner.group
                )
                log.info("pod %s: region created: %s%s", pod.key, _describe(found), _of(owner))
            else:
                before = {d.uuid.lower(): d.limits for d in record.devices}
                changed = self._store.update(pod.namespace, pod.name, limits, by_admin=False)
                if before != {d.uuid.lower(): d.limits for d in changed.devices}:
                    log.info("pod %s: limits changed: %s", pod.key, _describe(found))
            if entry is None or entry.qos is not None:  # else the admin's class stands
                # The class from tensor-fusion.ai/qos (medium without it); the weight stays
                # the API's.
                self._store.set_policy(pod.namespace, pod.name, found.qos or Qos.MEDIUM, None)
        except (PodError, OSError) as error:
            message = f"pod {pod.key}: cannot set its limits: {error}"
            log.error("%s", message)
            if self._events is not None:
                self._events.post(pod, "LimitsFailed", message)
        self._remember(pod, entry, found)

    def _from_dra(self, pod: KubePod) -> bool:
        """Whether the pod's region is the DRA driver's: its quota is what the scheduler
        allocated to its claims, which annotations must not raise (nor a whole GPU replace).

        The rule is the pod's own spec and status, known when the pod comes to this node and
        never changed after: it references a ResourceClaim, or its extended resources were
        given through one (the driver's extendedResourceName, on a node without the device
        plugin). Whether that claim is this driver's would need the claim read; a pod of
        this node that references claims of other drivers only gets no annotations-only
        region, since without a claim of ours it is given no GPU to limit.

        With the device plugin on too, a pod asking for the GPU resource is the device
        plugin's, whatever claims it references (a NIC's, say): before, its region, which
        Allocate made, was nobody's, and stayed when the pod was gone."""
        if not self._dra_places or not pod.dra_claims:
            return False
        if self._plugin_places and self._given_gpus(pod):
            return False
        if self._entry(pod) is not None:
            self._book.remove(pod.namespace, pod.name)  # made before: the driver's now
        if any(key.startswith(PREFIX) for key in pod.annotations):
            line = f"pod {pod.key}: its GPUs come from DRA claims: {PREFIX}* annotations ignored"
            if self._reported.get(pod.uid) != (line,):
                log.warning("%s", line)
                self._reported[pod.uid] = (line,)
        return True

    def _plugin_given(self, pod: KubePod, record: PodRecord | None) -> tuple[str, ...] | None:
        """The GPUs the device plugin gave the pod (() where it places none: gpu-ids, else
        every GPU), never one its claims of the DRA driver hold; None while it waits for them.

        Assigned before the daemon restarted, they are the plugin's bindings' (kept with them),
        else the GPUs its region holds. Both less the claims' GPUs: the region of a pod of both
        paths also holds what its claims were prepared (their quota, which annotations must not
        raise). Before, after a restart, every GPU of the region was taken for the plugin's, and
        a 60 GiB annotation was written over a claim's 2 GiB; so it was, before the binding,
        for a pod whose claim was prepared first."""
        assigned = self._assigned.get(pod.uid, ())
        if not assigned and self._plugin_places and self._asks_gpu(pod):
            if self.plugin_gpus is not None:
                assigned = tuple(self.plugin_gpus(pod.uid))
            elif record is not None:
                assigned = tuple(device.uuid for device in record.devices)
            if not assigned:
                return None
        if not assigned or not pod.dra_claims or not self._dra_places:
            return assigned
        claimed = {uuid.lower() for uuid in self.claim_gpus(pod.uid)}
        gpus = self._gpus()
        kept = tuple(
            one
            for one in assigned
            if (gpu := match_gpu(one, gpus)) is None or gpu.uuid.lower() not in claimed
        )
        return kept or None

    def _entry(self, pod: KubePod) -> Entry | None:
        """The book's entry of this pod (None for an earlier pod of its name: this one starts
        afresh)."""
        entry = self._book.get(pod.namespace, pod.name)
        return entry if entry is not None and entry.uid == pod.uid else None

    def _asks_gpu(self, pod: KubePod) -> bool:
        return any(self._names.gpu in container.resources for container in pod.containers)

    def _given_gpus(self, pod: KubePod) -> bool:
        """Whether the device plugin gives the pod GPUs: it asks for at least one (the kubelet
        calls no Allocate for a request of 0). A pod of the DRA driver naming the resource at
        0 is the driver's still: taken for the plugin's, its annotations were written over
        the quota its claim was given (60 GiB over 2)."""
        asked = effective_requests(pod.containers, (self._names.gpu,), lambda *_: None)
        return asked.get(self._names.gpu, 0) > 0

    def _region(self, pod: KubePod) -> PodRecord | None:
        try:
            return self._store.get(pod.namespace, pod.name)
        except PodNotFound:
            return None

    def _remember(self, pod: KubePod, entry: Entry | None, found: Resolution) -> None:
        """Book what the region holds now that the pod source wrote it (so that a later
        difference is the admin's), with the ceilings of an annotations-only pod's GPUs."""
        record = self._region(pod)
        identity = _identity(record.path) if record is not None else None
        if record is None or record.error is not None or identity is None:
            return  # no region, or none that can be read: the entry (if any) stays as it was
        same_file = entry is not None and entry.region == identity
        devices = {device.uuid.lower(): device for device in record.devices}
        written = dict(entry.written) if entry is not None and same_file else {}
        ceilings = dict(entry.ceilings) if entry is not None else {}
        for uuid, gpu in found.gpus.items():
            device = devices.get(uuid.lower())
            if device is not None:
                written[uuid] = Written(
                    device.memory_limit, device.compute_limit, device.compute_soft_limit
                )
            if not found.from_resources and uuid not in ceilings and not self._tenant_raise:
                # Annotations alone: no scheduler charged anything, and the tenant may edit
                # them; the limits it starts with are its ceiling (raising is the admin's,
                # unless the tenant_raise setting leaves it to the tenant).
                ceilings[uuid] = GpuCeiling(
                    Ceiling(known(gpu.memory), _STARTED), Ceiling(known(gpu.compute), _STARTED)
                )
        admin_qos = entry is not None and same_file and entry.qos is None
        self._book.put(
            pod.namespace,
            pod.name,
            Entry(
                uid=pod.uid,
                region=identity,
                ceilings=ceilings,
                written=written,
                qos=None if admin_qos else record.qos,
                admin_burst=entry.admin_burst if entry is not None and same_file else frozenset(),
            ),
        )
        if entry is None:
            forget_old_marker(record.path.parent)

    def _report(self, pod: KubePod, found: Resolution) -> None:
        """Problems and refusals are logged when they change and posted as events
        (rate-limited)."""
        lines = (*found.problems, *found.refused)
        if self._reported.get(pod.uid) != lines:
            for line in lines:
                log.warning("%s", line)
            self._reported[pod.uid] = lines
        if self._events is not None:
            for problem in found.problems:
                self._events.post(pod, "InvalidLimits", problem)
            for refused in found.refused:
                self._events.post(pod, "LimitRaiseRefused", refused)

    def _remove(self, pod: KubePod, why: str) -> None:
        entry = self._book.get(pod.namespace, pod.name)
        if entry is not None and entry.uid == pod.uid:
            self._delete(pod.namespace, pod.name, why=why)

    def _delete(self, namespace: str, name: str, *, why: str) -> None:
        try:
            record = self._store.delete(namespace, name, force=True)
        except PodNotFound:
            self._book.remove(namespace, name)  # removed meanwhile (through the API)
            return
        except PodError as error:
            log.error("pod %s/%s: cannot delete its region: %s", namespace, name, error)
            return  # the entry stays: the next list tries again
        self._book.remove(namespace, name)
        live = sum(1 for _ in record.processes)
        log.info(
            "pod %s/%s: region deleted (%s)%s",
            namespace,
            name,
            why,
            f"; kept until its {live} worker(s) exit" if live else "",
        )


def _admin_changes(
    pod: KubePod, entry: Entry, record: PodRecord, admin: Mapping[str, DeviceLimits]
) -> Entry:
    """The entry with what changed in the region since the pod source wrote it, as far as the
    admin changed it through the API (``admin``: what the API last wrote, by GPU): a limit
    changed so becomes the GPU's ceiling (annotations may lower it, not raise it); a changed
    burst is the admin's to keep. A change the API did not write is the pod's own processes'
    (a tenant can write its region): it raises no ceiling, and the pod source's next write sets
    the limits back. A region that is another file than the one written tells nothing."""
    if record.error is not None or _identity(record.path) != entry.region:
        return entry  # unreadable now, or another file: nothing in it is the admin's
    ceilings = dict(entry.ceilings)
    admin_burst = set(entry.admin_burst)
    by_lower = {uuid.lower(): uuid for uuid in entry.written}
    for device in record.devices:
        uuid = by_lower.get(device.uuid.lower())
        if uuid is None:
            continue
        written = entry.written[uuid]
        if _changed(device, written) and not _written_by(device, admin.get(uuid.lower())):
            log.warning(
                "pod %s: GPU %s limits changed in its region, not through the API (by the "
                "pod's own processes?): ignored, set back to the pod's",
                pod.key,
                uuid,
            )
            continue
        ceiling = ceilings.get(uuid, GpuCeiling())
        if device.memory_limit != written.memory:
            memory = device.memory_limit or None
            ceiling = dataclasses.replace(ceiling, memory=Ceiling(memory, _ADMIN))
            shown = format_size(memory) if memory else "none"
            log.info("pod %s: GPU %s memory limit set to %s %s", pod.key, uuid, shown, _BY_ADMIN)
        if device.compute_limit != written.compute:
            compute = device.compute_limit if device.compute_percent is not None else None
            ceiling = dataclasses.replace(ceiling, compute=Ceiling(compute, _ADMIN))
            shown = format_percent(hundredths_to_percent(compute)) if compute else "none"
            log.info("pod %s: GPU %s compute limit set to %s %s", pod.key, uuid, shown, _BY_ADMIN)
        if device.compute_soft_limit != written.soft:
            admin_burst.add(uuid)
        ceilings[uuid] = ceiling
    qos = entry.qos
    if qos is not None and record.qos != qos:
        log.info("pod %s: class set through the API; %s no longer changes it", pod.key, QOS)
        qos = None
    return dataclasses.replace(
        entry, ceilings=ceilings, admin_burst=frozenset(admin_burst), qos=qos
    )


def _changed(device: DeviceInfo, written: Written) -> bool:
    return (device.memory_limit, device.compute_limit, device.compute_soft_limit) != (
        written.memory,
        written.compute,
        written.soft,
    )


def _written_by(device: DeviceInfo, admin: DeviceLimits | None) -> bool:
    """Whether the region's limits of the GPU are what the admin last wrote."""
    return admin is not None and (
        device.memory_limit,
        device.compute_limit,
        device.compute_soft_limit,
    ) == (admin.memory_limit, admin.compute_limit, admin.compute_soft_limit)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the region file, read without following a link or opening it."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _of(owner: UserGroup) -> str:
    """Whose the region is, for the log ("" for root's)."""
    if owner.user is None and owner.group is None:
        return ""
    user = "root" if owner.user is None else str(owner.user)
    return f" (owner {user}" + ("" if owner.group is None else f", group {owner.group}") + ")"


def _describe(found: Resolution) -> str:
    parts = []
    for uuid, gpu in found.gpus.items():
        bytes_, hundredths = known(gpu.memory), known(gpu.compute)
        memory = format_size(bytes_) if bytes_ else "no memory limit"
        compute = "no compute limit"
        if hundredths is not None:
            compute = format_percent(hundredths_to_percent(hundredths))
        parts.append(f"{uuid} {memory}, {compute}")
    return "; ".join(parts)


class ClaimDriver(Protocol):
    """What the pod source and the DRA driver (dra/prepare.py's Preparer, a layer above) tell
    each other about the regions they share."""

    region_made_for: Callable[[str, str], str | None]
    claim_left: Callable[[str], object]

    def pod_gpus(self, pod_uid: str) -> set[str]: ...


def share_regions(
    source: PodSource,
    plugin_gpus: Callable[[str], Sequence[str]] | None,
    preparer: ClaimDriver | None,
) -> None:
    """Wire the pod source, the device plugin's bindings and the DRA driver, which may each
    hold a part of one pod's region, before the source's first list: the source knows a pod's
    GPUs from the plugin's bindings (after a restart too) and its claims' from the driver's
    checkpoint, so that it never takes every GPU of a pod's region for the plugin's; the driver
    knows which pod the source made a region for, so that an old pod's claim leaves a
    plugin-only namesake's region alone (docs/dra.md)."""
    if plugin_gpus is not None:
        source.plugin_gpus = plugin_gpus
    if preparer is not None:
        source.claim_gpus = preparer.pod_gpus
        preparer.region_made_for = source.region_made_for
        preparer.claim_left = source.claim_left
