"""A stand-in kubelet: the real Registration service on `kubelet.sock`, and a client of the
plugins that register, over real gRPC on unix sockets; `DeviceManager` picks and allocates a
resource's devices as the kubelet's device manager does."""

import queue
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
from vgpu_hypervisor.device_plugin.proto import api_pb2, api_pb2_grpc


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, registrations: "queue.Queue[api_pb2.RegisterRequest]") -> None:
        self._registrations = registrations

    def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version {request.version}")
        self._registrations.put(request)
        return api_pb2.Empty()


class FakeKubelet:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.registrations: queue.Queue[api_pb2.RegisterRequest] = queue.Queue()
        self._server: grpc.Server | None = None
        self._channels: list[grpc.Channel] = []

    @property
    def socket(self) -> Path:
        return self.folder / "kubelet.sock"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self.registrations), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

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


class DeviceManager:
    """The kubelet's device manager for one resource of a registered plugin: the healthy
    devices of its first ListAndWatch message, those it gave containers, and how it picks.

    As the kubelet (pkg/kubelet/cm/devicemanager, devicesToAllocate): when the plugin's
    options say it has GetPreferredAllocation, it is asked with the free devices and the
    count; the preferred devices that are free are taken, and any still missing are taken
    from the rest in the kubelet's own order (sorted here). Then Allocate; the devices are
    the container's only once Allocate succeeded."""

    def __init__(self, kubelet: FakeKubelet, request: api_pb2.RegisterRequest) -> None:
        self.stub = kubelet.plugin(request)
        self.options = self.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        stream = Watch(self.stub)
        self.devices = {d.ID for d in stream.next().devices if d.health == "Healthy"}
        stream.cancel()
        self.allocated: set[str] = set()
        self.preferred: list[list[str]] = []  # what GetPreferredAllocation answered, in order

    def free(self) -> set[str]:
        return self.devices - self.allocated

    def pick(self, needed: int) -> list[str]:
        available = self.free()
        if needed > len(available):
            raise ValueError(f"{needed} devices asked, {len(available)} free")
        chosen: list[str] = []
        if self.options.get_preferred_allocation_available:
            request = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=sorted(available), allocation_size=needed
                    )
                ]
            )
            answer = self.stub.GetPreferredAllocation(request, timeout=10)
            preferred = list(answer.container_responses[0].deviceIDs)
            self.preferred.append(preferred)
            chosen = [one for one in dict.fromkeys(preferred) if one in available][:needed]
        rest = sorted(available - set(chosen))
        return chosen + rest[: needed - len(chosen)]

    def allocate(self, ids: list[str]) -> api_pb2.ContainerAllocateResponse:
        response = self.stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
            ),
            timeout=10,
        )
        self.allocated.update(ids)
        answer: api_pb2.ContainerAllocateResponse = response.container_responses[0]
        return answer

    def admit(self, needed: int) -> tuple[list[str], api_pb2.ContainerAllocateResponse]:
        """Pick ``needed`` devices for one container and allocate them."""
        ids = self.pick(needed)
        return ids, self.allocate(ids)

    def release(self, ids: list[str]) -> None:
        """The container's pod ended: its devices are free again."""
        self.allocated.difference_update(ids)
