"""A stand-in kubelet: the real Registration service on `kubelet.sock`, a client of the plugins
that register, and the PodResources v1 service (`List`, `Get`) on its own socket, answered from
what its admissions actually allocated; all over real gRPC on unix sockets.

Admission follows the kubelet's device manager: a pod's containers get their devices one at a
time, init containers first in spec order, then the others, each resource through its plugin's
Allocate; a plain init container's devices go back to the pod for its later containers, which
take them first; a device is held by one pod until the pod is removed. Where a plugin's options
say it has GetPreferredAllocation, the kubelet asks it with the free devices, the reused ones
as must-include, and the count; it takes the preferred devices that are free, then any still
missing in its own order (devicesToAllocate in pkg/kubelet/cm/devicemanager). PodResources
lists each pod's containers and sidecars (init containers with restartPolicy Always), not its
plain init containers, as the kubelet's server does.

With ``follow`` set, each Register is taken as the kubelet's device manager takes it: a client
of the plugin, its options, and a ListAndWatch stream read until the plugin ends it (the
kubelet never closes a client's stream, an older one's included, when the plugin registers
again). ``refuse`` makes a resource's next Registers fail after that (an answer the plugin
never got).

Each Allocate answer is kept, as the kubelet's device manager keeps it, in
``kubelet_internal_checkpoint`` of the device-plugin folder (JSON: per pod, container and
resource the devices, by NUMA node or, with ``numa`` off, as a plain list as before Kubernetes
1.20, and the serialized answer in base64), rewritten when a pod is admitted or removed.
"""

import base64
import json
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from vgpu_hypervisor.device_plugin.podresources import api_pb2 as pr_pb2
from vgpu_hypervisor.device_plugin.podresources import api_pb2_grpc as pr_grpc
from vgpu_hypervisor.device_plugin.proto import api_pb2, api_pb2_grpc


@dataclass(frozen=True)
class Container:
    name: str
    resources: Mapping[str, int]  # extended resource → how many devices
    init: bool = False
    sidecar: bool = False  # an init container with restartPolicy: Always


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    containers: tuple[Container, ...]  # init containers among them, in spec order


@dataclass
class _Admitted:
    pod: Pod
    devices: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # container → resource
    answers: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (container, resource)


class Followed:
    """A ListAndWatch stream the kubelet keeps reading; ``ended`` once the plugin ended it."""

    def __init__(self, resource: str, call: Iterable[api_pb2.ListAndWatchResponse]) -> None:
        self.resource = resource
        self.ended = threading.Event()
        self._call = call
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for _ in self._call:
                pass
        except grpc.RpcError:
            pass
        self.ended.set()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: "FakeKubelet") -> None:
        self._kubelet = kubelet

    def List(
        self, request: pr_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr_pb2.ListPodResourcesResponse:
        self._check(context)
        with self._kubelet.lock:
            self._kubelet.lists += 1
            pods = list(self._kubelet.admitted.values())
        return pr_pb2.ListPodResourcesResponse(pod_resources=[_listed(one) for one in pods])

    def Get(
        self, request: pr_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr_pb2.GetPodResourcesResponse:
        self._check(context)
        with self._kubelet.lock:
            pods = list(self._kubelet.admitted.values())
        for one in pods:
            if (one.pod.namespace, one.pod.name) == (request.pod_namespace, request.pod_name):
                return pr_pb2.GetPodResourcesResponse(pod_resources=_listed(one))
        context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("unreachable")

    def GetAllocatableResources(
        self, request: pr_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr_pb2.AllocatableResourcesResponse:
        self._check(context)
        return pr_pb2.AllocatableResourcesResponse(
            devices=[
                pr_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                for resource, ids in self._kubelet.devices.items()
            ]
        )

    def _check(self, context: grpc.ServicerContext) -> None:
        if self._kubelet.pod_resources_down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the kubelet is starting")


def _listed(admitted: _Admitted) -> pr_pb2.PodResources:
    """A pod as the kubelet lists it: its sidecars, then its containers; no plain init one."""
    pod = admitted.pod
    shown = [c for c in pod.containers if c.init and c.sidecar]
    shown += [c for c in pod.containers if not c.init]
    return pr_pb2.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            pr_pb2.ContainerResources(
                name=container.name,
                devices=[
                    pr_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                    for resource, ids in admitted.devices.get(container.name, {}).items()
                ],
            )
            for container in shown
        ],
    )


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: "FakeKubelet") -> None:
        self._kubelet = kubelet

    def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version {request.version}")
        kubelet, resource = self._kubelet, request.resource_name
        with kubelet.lock:
            kubelet.asked.append(resource)
        if kubelet.follow:
            try:
                kubelet.follow_plugin(request)
            except grpc.RpcError as error:
                context.abort(grpc.StatusCode.UNKNOWN, f"cannot connect to the plugin: {error}")
        with kubelet.lock:
            refused = kubelet.refuse.get(resource, 0)
            kubelet.refuse[resource] = max(0, refused - 1)
        if refused:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the stand-in refuses it")
        kubelet.registrations.put(request)
        return api_pb2.Empty()


class FakeKubelet:
    def __init__(self, folder: Path, pod_resources: Path | None = None) -> None:
        self.folder = folder
        self.pod_resources = pod_resources or folder.parent / "pod-resources" / "kubelet.sock"
        self.registrations: queue.Queue[api_pb2.RegisterRequest] = queue.Queue()
        self._server: grpc.Server | None = None
        self._channels: list[grpc.Channel] = []
        # What admission allocated (kept across restarts, as the kubelet's checkpoint).
        self.lock = threading.Lock()
        self.admitted: dict[str, _Admitted] = {}  # by pod UID, in admission order
        self.devices: dict[str, list[str]] = {}  # resource → its plugin's devices
        self.plugins: dict[str, api_pb2_grpc.DevicePluginStub] = {}
        self.options: dict[str, api_pb2.DevicePluginOptions] = {}
        self.preferred: list[list[str]] = []  # what GetPreferredAllocation answered, in order
        self.pod_resources_down = False  # PodResources answers UNAVAILABLE meanwhile
        self.lists = 0  # how many List calls PodResources answered
        self.asked: list[str] = []  # the resource of every Register, taken or not
        self.follow = False  # take Registers as the kubelet does (the module's docstring)
        self.refuse: dict[str, int] = {}  # resource → how many of its next Registers fail
        self.followed: list[Followed] = []
        self.numa = True  # the checkpoint's DeviceIDs by NUMA node (else a plain list)

    @property
    def checkpoint(self) -> Path:
        return self.folder / "kubelet_internal_checkpoint"

    def write_checkpoint(self) -> None:
        """The admitted pods' devices and Allocate answers, in the kubelet's format."""
        with self.lock:
            entries = [
                {
                    "PodUID": one.pod.uid,
                    "ContainerName": container,
                    "ResourceName": resource,
                    "DeviceIDs": {"0": ids} if self.numa else ids,
                    "AllocResp": base64.b64encode(
                        one.answers.get((container, resource), b"")
                    ).decode(),
                }
                for one in self.admitted.values()
                for container, by_resource in one.devices.items()
                for resource, ids in by_resource.items()
            ]
            data = {"PodDeviceEntries": entries, "RegisteredDevices": dict(self.devices)}
        written = self.checkpoint.with_suffix(".new")
        written.write_text(json.dumps({"Data": data, "Checksum": 0}))
        written.replace(self.checkpoint)

    @property
    def socket(self) -> Path:
        return self.folder / "kubelet.sock"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pod_resources.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.add_insecure_port(f"unix://{self.pod_resources}")
        server.start()
        self._server = server

    def connect(self, count: int = 3, timeout: float = 30) -> None:
        """Take the plugins' registrations and each resource's devices (its first ListAndWatch
        message), as the kubelet does before it admits pods asking for them."""
        for request in self.wait_registrations(count, timeout):
            stub = self.plugin(request)
            watch = Watch(stub)
            self.devices[request.resource_name] = [d.ID for d in watch.next().devices]
            watch.cancel()
            self.plugins[request.resource_name] = stub
            self.options[request.resource_name] = stub.GetDevicePluginOptions(
                api_pb2.Empty(), timeout=10
            )

    def follow_plugin(self, request: api_pb2.RegisterRequest) -> None:
        """As the kubelet's device manager on Register: a new client of the plugin, its
        options, and its ListAndWatch stream, read for as long as the plugin keeps it."""
        stub = self.plugin(request)
        stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        followed = Followed(request.resource_name, stub.ListAndWatch(api_pb2.Empty()))
        with self.lock:
            self.followed.append(followed)

    def open_streams(self, resource: str) -> int:
        """The streams of the resource the kubelet still reads (follow)."""
        with self.lock:
            return sum(1 for f in self.followed if f.resource == resource and not f.ended.is_set())

    def admit(
        self, pod: Pod, choose: Mapping[tuple[str, str], list[str]] | None = None
    ) -> dict[str, api_pb2.ContainerAllocateResponse]:
        """Allocate the pod's containers' devices as the kubelet's device manager does; each
        container's answer (the GPU resource's, which carries envs and mounts) by name. A
        plugin's error fails the admission (its devices are given back). ``choose``: by
        (container, resource), the devices taken without asking the plugin (an older kubelet,
        or its own order)."""
        admitted = _Admitted(pod)
        with self.lock:
            self.admitted[pod.uid] = admitted
        answers: dict[str, api_pb2.ContainerAllocateResponse] = {}
        reusable: dict[str, list[str]] = {}
        try:
            for container in pod.containers:
                for resource, count in container.resources.items():
                    ids = (choose or {}).get((container.name, resource)) or self._take(
                        pod, resource, count, reusable
                    )
                    answer = self.plugins[resource].Allocate(
                        api_pb2.AllocateRequest(
                            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
                        ),
                        timeout=30,
                    )
                    (one,) = answer.container_responses
                    with self.lock:
                        admitted.devices.setdefault(container.name, {})[resource] = ids
                        admitted.answers[container.name, resource] = one.SerializeToString()
                    self.write_checkpoint()
                    if container.init and not container.sidecar:
                        reusable[resource] = sorted({*reusable.get(resource, []), *ids})
                    else:
                        reusable[resource] = [d for d in reusable.get(resource, []) if d not in ids]
                    if one.envs or container.name not in answers:
                        answers[container.name] = one
        except grpc.RpcError:
            self.remove(pod)
            raise
        return answers

    def _take(
        self, pod: Pod, resource: str, count: int, reusable: dict[str, list[str]]
    ) -> list[str]:
        with self.lock:
            held = {
                one
                for other in self.admitted.values()
                for by_resource in other.devices.values()
                for one in by_resource.get(resource, [])
            }
        mine = reusable.get(resource, [])[:count]
        free = [d for d in self.devices[resource] if d not in held and d not in mine]
        options = self.options.get(resource)
        if len(mine) < count and options is not None and options.get_preferred_allocation_available:
            request = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=sorted([*free, *mine]),
                        must_include_deviceIDs=mine,
                        allocation_size=count,
                    )
                ]
            )
            answer = self.plugins[resource].GetPreferredAllocation(request, timeout=10)
            preferred = list(answer.container_responses[0].deviceIDs)
            self.preferred.append(preferred)
            first = [d for d in dict.fromkeys(preferred) if d in free]
            free = first + [d for d in free if d not in first]
        taken = mine + free[: count - len(mine)]
        if len(taken) < count:
            raise AssertionError(f"pod {pod.name}: {count} {resource} asked, {len(taken)} free")
        return taken

    def remove(self, pod: Pod) -> None:
        """The pod is gone: its devices are free, PodResources no longer lists it."""
        with self.lock:
            self.admitted.pop(pod.uid, None)
        self.write_checkpoint()

    def restart(self) -> None:
        """As a kubelet that starts again: every socket of the folder removed, a new one made."""
        self.stop()
        for path in self.folder.glob("*.sock"):
            path.unlink()
        self.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
            self._server = None
        for channel in self._channels:
            channel.close()
        self._channels.clear()

    def wait_registrations(self, count: int, timeout: float = 30) -> list[api_pb2.RegisterRequest]:
        return [self.registrations.get(timeout=timeout) for _ in range(count)]

    def plugin(self, request: api_pb2.RegisterRequest) -> api_pb2_grpc.DevicePluginStub:
        """A client of a registered plugin, dialled at its endpoint as the kubelet does."""
        channel = grpc.insecure_channel(f"unix://{self.folder / request.endpoint}")
        self._channels.append(channel)
        return api_pb2_grpc.DevicePluginStub(channel)


class Watch:
    """A ListAndWatch stream as the kubelet reads it: one message at a time, then cancelled."""

    def __init__(self, stub: api_pb2_grpc.DevicePluginStub) -> None:
        self._call = stub.ListAndWatch(api_pb2.Empty(), timeout=30)
        self._messages: Iterator[api_pb2.ListAndWatchResponse] = iter(self._call)

    def next(self) -> api_pb2.ListAndWatchResponse:
        return next(self._messages)

    def cancel(self) -> None:
        self._call.cancel()  # type: ignore[no-untyped-call]  # untyped in grpc-stubs
