"""A client of the kubelet's PodResources API v1 (``List``): which pod and container the kubelet
gave which devices of a resource.

The kubelet serves it on a unix socket (``/var/lib/kubelet/pod-resources/kubelet.sock``) to
node agents; a device's ID is held by one pod at a time. It lists every pod the kubelet has,
with its containers and, for each, the devices of each resource it was given; a sidecar
(an init container with ``restartPolicy: Always``) is listed as a container, a plain init
container is not (its devices show under the pod's later containers, which the kubelet gives
them first).
"""

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from vgpu_hypervisor.device_plugin.podresources import api_pb2, api_pb2_grpc

DEFAULT_SOCKET: Final = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# The kubelet answers List for the whole node in one message: well above gRPC's 4 MiB default.
_MOST_BYTES: Final = 64 << 20
# While the kubelet is down, gRPC waits longer and longer between tries to connect again (up to
# 120 s): the binder, and the containers waiting on it (TF_REGION_WAIT, 60 s), would wait as
# long after the kubelet is back. At most a second here; and a List that finds no kubelet tries
# once more on a new channel, which connects at once (its own subchannel: gRPC would otherwise
# share the old one, still waiting).
_OPTIONS: Final = [
    ("grpc.max_receive_message_length", _MOST_BYTES),
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class PodResourcesError(Exception):
    """The kubelet's PodResources API did not answer; one line."""


@dataclass(frozen=True)
class Holder:
    """One container the kubelet lists, and the devices of the resource it holds."""

    namespace: str
    pod: str
    container: str
    devices: frozenset[str]


class PodResources:
    """``holders()`` of one resource, through one channel kept open while the kubelet answers
    (thread-safe)."""

    def __init__(self, socket: Path, resource: str, timeout_s: float = 10.0) -> None:
        self.socket = socket
        self.resource = resource
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._channel = grpc.insecure_channel(f"unix://{socket}", options=_OPTIONS)

    def holders(self) -> list[Holder]:
        """Every container of every pod the kubelet lists (those holding none of the
        resource's devices too); PodResourcesError when the kubelet does not answer."""
        try:
            answer = self._list()
        except _Failed as failed:
            error = failed.error
            if not isinstance(error, grpc.Call) or error.code() != grpc.StatusCode.UNAVAILABLE:
                raise self._failed(error) from None
            with self._lock:
                # Only the channel that failed is replaced: another thread may have replaced
                # it already, or be listing on the new one (closing it would cancel that).
                if self._channel is failed.channel and not self._closed:
                    self._channel.close()
                    self._channel = grpc.insecure_channel(f"unix://{self.socket}", options=_OPTIONS)
            try:
                answer = self._list()
            except _Failed as again:
                raise self._failed(again.error) from None
        return [
            Holder(
                pod.namespace,
                pod.name,
                container.name,
                frozenset(
                    one
                    for devices in container.devices
                    if devices.resource_name == self.resource
                    for one in devices.device_ids
                ),
            )
            for pod in answer.pod_resources
            for container in pod.containers
        ]

    def _list(self) -> api_pb2.ListPodResourcesResponse:
        """The kubelet's answer; _Failed names the channel that failed."""
        with self._lock:
            if self._closed:
                raise PodResourcesError(f"the kubelet's PodResources API at {self.socket}: closed")
            channel = self._channel
        try:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)
            return stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout_s)
        except grpc.RpcError as error:
            raise _Failed(channel, error) from None

    def _failed(self, error: grpc.RpcError) -> PodResourcesError:
        code = error.code().name if isinstance(error, grpc.Call) else "error"
        detail = error.details() if isinstance(error, grpc.Call) else str(error)
        line = " ".join(str(detail).split())
        return PodResourcesError(f"the kubelet's PodResources API at {self.socket}: {code}: {line}")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._channel.close()


class _Failed(Exception):
    """A List that failed, with the channel it was made on."""

    def __init__(self, channel: grpc.Channel, error: grpc.RpcError) -> None:
        super().__init__(str(error))
        self.channel = channel
        self.error = error
