"""The kubelet device plugin: its three resources' calls (Allocate, GetPreferredAllocation,
ListAndWatch), served and registered with the kubelet by serving.py. gRPC runs on its own
threads; the daemon calls ``update_health`` from sampling.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final, NoReturn

import grpc
from vgpu_common.limits import parse_quantity

from vgpu_hypervisor.device_plugin import checkpoint
from vgpu_hypervisor.device_plugin.accounting import (
    FOLDER,
    DoesNotFit,
    Ledger,
    LivePods,
    Placement,
    largest,
    place,
    place_unknown,
    pod_asks,
)
from vgpu_hypervisor.device_plugin.allocation import (
    AllocationError,
    InvalidRequest,
    Layout,
    NodePods,
    PreparePod,
    check_request,
    container_response,
    pod_region,
)
from vgpu_hypervisor.device_plugin.binding import FOLDER as ALLOCATIONS
from vgpu_hypervisor.device_plugin.binding import Allocation, BindingError, Bindings, Refused
from vgpu_hypervisor.device_plugin.pod_resources import DEFAULT_SOCKET, PodResources
from vgpu_hypervisor.device_plugin.proto import api_pb2, api_pb2_grpc
from vgpu_hypervisor.device_plugin.resources import (
    KINDS,
    Gpu,
    check_inventory,
    device_ids,
    health_of,
)
from vgpu_hypervisor.device_plugin.serving import CONTROL, Serving, Streams, options
from vgpu_hypervisor.gpu.snapshot import NodeSnapshot
from vgpu_hypervisor.kubernetes.annotations import Kind
from vgpu_hypervisor.kubernetes.model import KubeContainer, KubePod
from vgpu_hypervisor.kubernetes.requests import effective_requests

log = logging.getLogger("vgpu_hypervisor.device_plugin")
DEFAULT_FOLDER: Final = Path("/var/lib/kubelet/device-plugins")
_ASSIGNED_KEPT: Final = 4096
# Posts a Warning event on a pod: (pod, reason, message).
PostEvent = Callable[[KubePod, str, str], object]
REFUSED: Final = "GpuDoesNotFit"  # the reason of the event of a pod refused at binding
# How long GetPreferredAllocation waits for the pod source to show the pod being admitted. The
# kubelet's call has no deadline (context.Background()), but it admits pods one at a time: the
# wait delays every pod of the node, so it stays short. The pod source's watch sees a pod as
# the kubelet does, within a moment; a watch that broke reconnects after 0.5 s (Backoff) and
# lists again, well within it. Longer is an outage: the answer from the devices alone stands.
PREFERRED_WAIT_S: Final = 2.0
# After a wait that saw no pod, the calls of this long answer at once: the kubelet asks once
# per container and admits pods one at a time, and a watch that is out waits for none of them.
GAVE_UP_HOLD_S: Final = 5.0
_WAIT_POLL_S: Final = 0.05  # the pod source tells no change: it is looked at this often
# GetPreferredAllocation calls that may wait at once: the server's other threads for its other
# calls (CONTROL in all) keep one for Allocate and GetDevicePluginOptions. A call past them
# answers at once.
_WAITERS: Final = CONTROL - 1


@dataclass(frozen=True)
class PluginConfig:
    layout: Layout
    folder: Path = DEFAULT_FOLDER
    shares: int = 10
    poll_s: float = 1.0
    register_timeout_s: float = 5.0
    placement: Placement = "binpack"  # GetPreferredAllocation's rule (accounting.place)
    preferred_wait_s: float = PREFERRED_WAIT_S  # for a pod the pod source does not show yet
    # The kubelet's PodResources socket, and how the allocations are bound (binding.py).
    pod_resources: Path = DEFAULT_SOCKET
    bind_poll_s: float = 1.0  # while an allocation is unbound
    bind_idle_s: float = 10.0  # else: links follow regions, allocations of gone pods go
    forget_s: float = 60.0
    region_wait_s: int = 60  # TF_REGION_WAIT: how long a container's process waits for it


# XIDs a program causes itself (a fault in its kernel, a watchdog on its own work): they say
# nothing about the GPU, as NVIDIA's own device plugin also treats them.
APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})


def healthy_gpus(uuids: Sequence[str], snapshot: NodeSnapshot) -> dict[str, bool]:
    """Per advertised GPU: it is in the snapshot with its UUID and memory readable, and no XID
    error other than an application's came since the daemon started. A GPU that fell off the
    bus, or whose driver stopped answering, fails the first; one with a double-bit ECC error or
    that needs a reset, the second (until the daemon restarts, as a reset means draining it)."""
    seen = {
        device.uuid.lower()
        for device in snapshot.devices
        if isinstance(device.uuid, str)
        and isinstance(device.memory_total, int)
        and not _hardware_xids(device.xid_errors)
    }
    return {uuid: uuid.lower() in seen for uuid in uuids}


def _hardware_xids(xids: object) -> bool:
    if not isinstance(xids, tuple):
        return False  # the driver gives no events: nothing known against the GPU
    return any(code not in APPLICATION_XIDS and count > 0 for code, count in xids)


def inventory(snapshot: NodeSnapshot) -> list[Gpu]:
    """The GPUs to advertise: those whose UUID and memory a sample read."""
    return [
        Gpu(device.uuid, device.memory_total)
        for device in snapshot.devices
        if isinstance(device.uuid, str) and isinstance(device.memory_total, int)
    ]


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, plugin: "DevicePlugin", kind: Kind) -> None:
        self._plugin = plugin
        self._kind = kind
        self._streams = Streams(plugin.changed, plugin.resource(kind))

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return options(self._kind)

    def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        plugin = self._plugin
        stream = self._streams.open()
        # A stream the kubelet cancels or drops wakes at once and gives its thread back.
        context.add_callback(lambda: self._streams.close(stream))
        sent = -1
        try:
            while context.is_active() and not plugin.stopping and not stream.ended:
                with plugin.changed:
                    if plugin.generation == sent and not stream.ended:
                        # Woken by a change, a stop or the stream's end; the timeout notices a
                        # kubelet gone away.
                        plugin.changed.wait(timeout=plugin.poll_s)
                    generation, healthy = plugin.generation, dict(plugin.healthy)
                if generation != sent and not plugin.stopping and not stream.ended:
                    sent = generation
                    yield api_pb2.ListAndWatchResponse(
                        devices=[
                            api_pb2.Device(ID=one, health=health_of(one, healthy))
                            for one in plugin.ids[self._kind]
                        ]
                    )
        finally:
            self._streams.close(stream)

    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        try:
            if self._kind != "gpu":
                # Memory and compute devices only count capacity; the GPU resource's Allocate
                # makes the pod's region, which holds the limits.
                self._plugin.check(self._kind, request)
                return api_pb2.AllocateResponse(
                    container_responses=[
                        api_pb2.ContainerAllocateResponse() for _ in request.container_requests
                    ]
                )
            return self._plugin.allocate(request)
        except InvalidRequest as error:
            log.warning("Allocate %s: %s", self._plugin.resource(self._kind), error)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            raise
        except AllocationError as error:
            log.warning("Allocate %s: %s", self._plugin.resource(self._kind), error)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
            raise  # abort raises; this keeps type checkers sure
        except Exception as error:  # the pod source or a file failed: one line, not a trace
            message = f"Allocate failed: {type(error).__name__}: {error}"
            log.error("%s", message, exc_info=log.isEnabledFor(logging.DEBUG))
            context.abort(grpc.StatusCode.INTERNAL, message)
            raise

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        if self._kind != "gpu":
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no preferred allocation (not advertised)")
        try:
            return self._plugin.preferred(request, context.is_active)
        except Exception as error:  # not the pod source's (handled): no preference, kubelet picks
            log.warning("GetPreferredAllocation: %s: %s", type(error).__name__, error)
            return api_pb2.PreferredAllocationResponse(
                container_responses=[
                    api_pb2.ContainerPreferredAllocationResponse()
                    for _ in request.container_requests
                ]
            )


def _ignored(container: KubeContainer, resource: str, text: str, why: str) -> None:
    """A quantity that cannot be read: the pod source reports it."""


def _asked(quantity: str | None) -> int:
    """The whole number a container's resource asks for (0 when none); ValueError if bad."""
    return 0 if quantity is None else parse_quantity(quantity)


class DevicePlugin:
    """Serves and registers the three resources; ``start`` then ``stop``."""

    def __init__(
        self,
        config: PluginConfig,
        gpus: Sequence[Gpu],
        pods: NodePods,
        prepare: PreparePod,
        minors: Mapping[str, int] | None = None,
        *,
        live: LivePods | None = None,
        events: PostEvent | None = None,
    ) -> None:
        """``live``: the pods of the node still holding their devices (their charges are
        released when they are not); ``events``: where a pod refused at binding is told."""
        layout = config.layout
        check_inventory(gpus, config.shares, layout.names.memory_unit)
        self.config = config
        self.poll_s = config.poll_s
        unit = layout.names.memory_unit
        self.ids = {k: device_ids(k, gpus, config.shares, unit) for k in KINDS}
        self._known = {k: frozenset(ids) for k, ids in self.ids.items()}
        self.healthy: dict[str, bool] = {gpu.uuid: True for gpu in gpus}
        self.generation = 0
        self.changed = threading.Condition()
        self.stopping = False
        self._pods = pods
        self.ledger = Ledger(gpus, layout.host_base / FOLDER, live)
        self._events = events
        self._prepare = prepare
        self.bindings = Bindings(
            layout.host_base,
            PodResources(config.pod_resources, layout.names.gpu),
            self._find,
            self._bind,
            poll_s=config.bind_poll_s,
            idle_s=config.bind_idle_s,
            forget_s=config.forget_s,
            live=live,
            lost=partial(
                checkpoint.mounted_folders,
                config.folder / checkpoint.FILE,
                layout.names.gpu,
                layout.host_base / ALLOCATIONS,
            ),
        )
        self._minors = dict(minors or {})
        self._serving = Serving(
            config.folder,
            {kind: self.resource(kind) for kind in KINDS},
            lambda kind: _Servicer(self, kind),
            poll_s=config.poll_s,
            register_timeout_s=config.register_timeout_s,
        )
        # pod UID → the GPUs its containers were given, newest last (bounded).
        self._assigned: dict[str, tuple[str, ...]] = {}
        self._assigned_lock = threading.Lock()
        self._waiters = threading.BoundedSemaphore(_WAITERS)
        self._gave_up_until = 0.0  # monotonic: calls answer at once until then (GAVE_UP_HOLD_S)
        for kept in self.bindings.all():  # bound by an earlier daemon
            if kept.uid and not kept.refused:
                self._remember(kept.uid, kept.gpus)

    def resource(self, kind: Kind) -> str:
        return self.config.layout.names.of(kind)

    def socket_path(self, kind: Kind) -> Path:
        return self._serving.socket_path(kind)

    # Health

    def update_health(self, snapshot: NodeSnapshot) -> None:
        """Mark the GPUs the snapshot lost (or got back); ListAndWatch streams send the change."""
        self.set_health(healthy_gpus(list(self.healthy), snapshot))

    def set_health(self, healthy: Mapping[str, bool]) -> None:
        with self.changed:
            new = {uuid: healthy.get(uuid, state) for uuid, state in self.healthy.items()}
            if new == self.healthy:
                return
            for uuid, state in new.items():
                if state != self.healthy[uuid]:
                    log.warning("GPU %s is %s", uuid, "healthy again" if state else "unhealthy")
            self.healthy = new
            self.generation += 1
            self.changed.notify_all()

    # Allocate

    def check(self, kind: Kind, request: api_pb2.AllocateRequest) -> None:
        """InvalidRequest or AllocationError (allocation.check_request) for a request of
        ``kind`` that names no device or one this plugin does not advertise."""
        check_request(request, self._known[kind], self.resource(kind))

    def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        """Each container its own allocation: a folder the pod's region is linked into once
        the kubelet says which pod holds its devices (binding.py). All or none: an answer that
        fails removes the allocations it made, which no pod would ever hold."""
        self._pods()  # AllocationError when the daemon does not know the node's pods
        self.check("gpu", request)
        responses: list[api_pb2.ContainerAllocateResponse] = []
        made: list[Allocation] = []
        try:
            for one in request.container_requests:
                responses.append(self._answer(list(one.devices_ids), made))
        except Exception:
            for allocation in made:
                self.bindings.remove(allocation.id, "its Allocate failed")
            raise
        return api_pb2.AllocateResponse(container_responses=responses)

    def _answer(self, ids: list[str], made: list[Allocation]) -> api_pb2.ContainerAllocateResponse:
        """One container's answer, its allocation added to ``made``."""
        try:
            allocation = self.bindings.allocate(ids)
        except BindingError as error:
            raise AllocationError(str(error)) from None
        made.append(allocation)
        response = container_response(
            self.config.layout,
            device_ids=ids,
            host_folder=self.bindings.path(allocation.id),
            minors=self._minors,
            region_wait_s=self.config.region_wait_s,
        )
        log.info(
            "Allocate: allocation %s gets %s (its pod's region once the kubelet lists it)",
            allocation.id,
            ",".join(allocation.gpus),
        )
        return response

    def _find(self, namespace: str, name: str) -> KubePod | None:
        """The pod of that name the pod source knows (the newest, when an old one of the name
        is still being deleted)."""
        pods = [p for p in self._pods() if (p.namespace, p.name) == (namespace, name)]
        pods.sort(key=lambda p: (not p.deleting, p.created))
        return pods[-1] if pods else None

    def _bind(self, pod: KubePod, container: str, uuids: Sequence[str], allocation: str) -> None:
        """The pod charged on ``uuids`` (Refused when they cannot hold it), then its region with
        its limits there (made when missing), as the pod source resolves them; the binder then
        links it into the allocation's folder. A charge stays when the region cannot be made
        (the kubelet gave the pod those GPUs; the binder tries again)."""
        found = self.bindings.get(allocation)
        self._charge(pod, found.devices if found is not None else uuids, uuids)
        asked, owner = pod_region(pod, self.config.layout, uuids)
        try:
            _, limits = self._prepare(pod, asked, owner)
        except Exception as error:
            raise AllocationError(f"cannot prepare its region: {error}") from None
        self._remember(pod.uid, uuids)
        log.info(
            "allocation %s: pod %s container %s gets %s (memory %s, compute %s)",
            allocation,
            pod.key,
            container,
            ",".join(uuids),
            {u: limits[u].memory for u in uuids},
            {u: limits[u].compute for u in uuids},
        )

    def _charge(self, pod: KubePod, ids: Sequence[str], uuids: Sequence[str]) -> tuple[str, ...]:
        """Charge the pod on the GPUs the kubelet gave it (accounting.py); the GPUs charged
        now. A refusal (two shares of one GPU, a GPU that cannot hold the pod) is Refused and
        an event on the pod, so that its owner sees why its processes fail."""
        if len(uuids) < len(ids):
            why = (
                f"pod {pod.key}: the kubelet gave one container {len(ids)} shares of "
                f"{len(uuids)} GPU(s) ({', '.join(uuids)}); each GPU asked for must be another"
            )
            self._refuse(pod, why)
        asks = pod_asks(pod, self.config.layout.gpus, self.config.layout.names)
        try:
            return self.ledger.charge(pod.uid, pod.key, {u: asks[u] for u in uuids if u in asks})
        except DoesNotFit as error:
            self._refuse(pod, str(error))

    def _refuse(self, pod: KubePod, why: str) -> NoReturn:
        if self._events is not None:
            try:
                self._events(pod, REFUSED, why)
            except Exception as error:  # the refusal stands; the log still says why
                kind = type(error).__name__
                log.warning("pod %s: event not posted: %s: %s", pod.key, kind, error)
        raise Refused(why)

    # GetPreferredAllocation

    def preferred(
        self, request: api_pb2.PreferredAllocationRequest, active: Callable[[], bool]
    ) -> api_pb2.PreferredAllocationResponse:
        """Per container, the GPU shares the placement rule takes for the pods that may be
        the one being admitted, or from the devices alone when the pod source shows none
        within ``preferred_wait_s`` (while the kubelet's call is ``active``). The pods
        admitted before it are bound first: charged, their GPUs' room is known."""
        waiting = self._waiters.acquire(blocking=False)
        # Past as many calls as may wait, or soon after one waited in vain, a call answers
        # from what is known now.
        now = time.monotonic()
        patient = waiting and now >= self._gave_up_until
        deadline = now + self.config.preferred_wait_s if patient else 0.0
        try:
            self.bindings.settle()
            return api_pb2.PreferredAllocationResponse(
                container_responses=[
                    api_pb2.ContainerPreferredAllocationResponse(
                        deviceIDs=self._preference(one, deadline, active)
                    )
                    for one in request.container_requests
                ]
            )
        finally:
            if waiting:
                self._waiters.release()

    def _preference(
        self,
        request: api_pb2.ContainerPreferredAllocationRequest,
        deadline: float,
        active: Callable[[], bool],
    ) -> list[str]:
        """The request names devices, never the pod: the kubelet admits one pod at a time,
        and the one it admits is among the pending pods with a container asking for
        ``allocation_size`` GPUs that are not charged yet. The shares go where the largest
        of their asks fits (right for whichever it is), else where the oldest one's that
        fits does; none when none fits (the binding refuses any choice). With no such pod
        known, one share on each of as many GPUs as asked, by the placement rule alone.
        Empty when no answer keeps to the request (the kubelet's contract: a subset of the
        available devices, with those it must include, of its size)."""
        size = request.allocation_size
        pods = self._await_candidates(size, deadline, active)
        free = self.ledger.free()  # after the wait: pods bound meanwhile are charged
        available = list(request.available_deviceIDs)
        must = list(request.must_include_deviceIDs)
        policy = self.config.placement
        if not pods:
            if deadline > 0:
                self._gave_up_until = time.monotonic() + GAVE_UP_HOLD_S
            chosen = place_unknown(free, available, must, size=size)
            log.warning(
                "GetPreferredAllocation: no pending pod asking for %d GPU(s) known: %s",
                size,
                f"the devices with the most room: {', '.join(chosen)}" if chosen else "none",
            )
            return chosen or []
        asks = [pod_asks(pod, self.config.layout.gpus, self.config.layout.names) for pod in pods]
        for ask in [largest(asks), *asks]:
            chosen = place(free, ask, available, must, size=size, policy=policy)
            if chosen is not None:
                return chosen
        return []

    def _await_candidates(
        self, size: int, deadline: float, active: Callable[[], bool]
    ) -> list[KubePod]:
        """The candidates for ``size`` (``_candidates``), waiting until ``deadline`` for the
        pod source to show one: its watch may be a moment behind the kubelet's, or
        reconnecting. [] when none came in time, the plugin stops or the kubelet gave up."""
        waited = False
        while True:
            found = self._known_candidates(size)
            if found and waited:
                # The watch that lagged may have hidden the pod admitted just before too,
                # whose binding (its charge) the placement needs: bound now, it is no longer
                # a candidate.
                self.bindings.settle()
                found = self._known_candidates(size)
            if found or not self._pause(deadline, active):
                return found
            waited = True

    def _known_candidates(self, size: int) -> list[KubePod]:
        try:
            return self._candidates(size)
        except Exception as error:  # the pod source failed: as if it showed no pod yet
            log.debug("GetPreferredAllocation: the pod source: %s: %s", type(error).__name__, error)
            return []

    def _pause(self, deadline: float, active: Callable[[], bool]) -> bool:
        """A poll's time waited; False, at once, past ``deadline``, once the plugin stops
        (``stop`` wakes it) or the kubelet cancelled its call."""
        left = deadline - time.monotonic()
        if left <= 0 or not active():
            return False
        with self.changed:
            if self.stopping:
                return False
            self.changed.wait(min(_WAIT_POLL_S, left))
            return not self.stopping

    def _candidates(self, size: int) -> list[KubePod]:
        """Pending pods with a container asking for ``size`` GPUs, less charged than asked."""
        gpu = self.config.layout.names.gpu
        found = []
        for pod in sorted(self._pods(), key=lambda p: (p.created, p.key)):
            if pod.phase != "Pending" or pod.deleting:
                continue
            try:
                counts = [_asked(c.resources.get(gpu)) for c in pod.containers]
            except ValueError:
                continue  # the pod source reports it
            # Init containers and sidecars included: the kubelet allocates theirs too.
            total = effective_requests(pod.containers, (gpu,), _ignored).get(gpu, 0)
            if size in counts and len(self.ledger.charged(pod.uid)) < total:
                found.append(pod)
        return found

    def assigned(self, pod_uid: str) -> tuple[str, ...]:
        """The GPU UUIDs Allocate gave the pod's containers (the pod source's default GPUs
        for a pod whose annotations name none); () when none yet."""
        with self._assigned_lock:
            return self._assigned.get(pod_uid, ())

    def _remember(self, pod_uid: str, uuids: Sequence[str]) -> None:
        with self._assigned_lock:
            known = self._assigned.pop(pod_uid, ())
            self._assigned[pod_uid] = tuple(sorted({*known, *uuids}))
            while len(self._assigned) > _ASSIGNED_KEPT:
                del self._assigned[next(iter(self._assigned))]

    # Serving and registering

    def start(self) -> None:
        """Serve every resource and register it with the kubelet (serving.py)."""
        self.bindings.start()
        self._serving.start()

    def stop(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        self._serving.stop()
        self.bindings.stop()

    def registered(self) -> bool:
        return self._serving.registered()
