"""Serving the plugin's resources: one gRPC server per resource on a unix socket in the kubelet's
device-plugin folder, each registered with the kubelet, and again after the kubelet restarts.

A kubelet that starts removes the sockets of that folder and makes a new ``kubelet.sock``; the
watcher polls the socket's inode (every ``poll_s``) and, when it changed or a socket of ours is
gone, serves that resource again and registers it again. A resource whose Register fails (no
kubelet yet) is tried again at the same pace; the others are left as they are.

Every Register the kubelet takes gives it a new client with its own ListAndWatch stream, and it
never closes the older ones; each open stream holds one of its server's threads. With four
threads in all and every resource registered again after any failure, four such streams left
Allocate queued for ever (the kubelet's Allocate has no deadline: pod admission hung) and
registration could never complete. So:

- a resource is registered only through a server no Register went through: one whose Register
  failed is served again at once (which ends any stream the kubelet opened through it, as when
  its answer came after ours timed out), and one registered is not registered again;
- a server keeps at most ``STREAMS`` streams open, a newer one ending the oldest, and has
  ``CONTROL`` threads more, so that Allocate, GetPreferredAllocation and GetDevicePluginOptions
  always get one. A GetPreferredAllocation that waits for the pod source to show its pod
  (server.py) holds its thread for at most ``preferred_wait_s``, and at most ``CONTROL - 1``
  wait at once: one of these threads is always left for the others.

Ending a stream is the last resort, not the way to replace one: a current kubelet
(devicemanager/plugin/v1beta1) takes the end of any of a resource's streams for the plugin
going away, marks the resource unhealthy and stops its newest endpoint with it (Allocate fails
until the plugin registers again).
"""

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Final

import grpc

from vgpu_hypervisor.device_plugin.proto import api_pb2, api_pb2_grpc
from vgpu_hypervisor.kubernetes.annotations import Kind

log = logging.getLogger("vgpu_hypervisor.device_plugin")
API_VERSION: Final = "v1beta1"
KUBELET_SOCKET: Final = "kubelet.sock"
STREAMS: Final = 4  # ListAndWatch streams a server keeps open (a kubelet has one)
CONTROL: Final = 4  # threads of a server for its other calls
# The servicer of a resource, made anew for each server.
MakeServicer = Callable[[Kind], api_pb2_grpc.DevicePluginServicer]


def options(kind: Kind) -> api_pb2.DevicePluginOptions:
    """Only the GPU resource's shares are placed (memory and compute devices only count)."""
    return api_pb2.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=kind == "gpu"
    )


class Stream:
    """One open ListAndWatch stream; ``ended`` once it must return."""

    def __init__(self) -> None:
        self.ended = False


class Streams:
    """The open ListAndWatch streams of one server, oldest first. Guarded by ``changed``, the
    condition they wait on, so that a stream ended here wakes at once."""

    def __init__(self, changed: threading.Condition, resource: str, most: int = STREAMS) -> None:
        self._changed = changed
        self._resource = resource
        self._most = most
        self._open: list[Stream] = []

    def open(self) -> Stream:
        """A new stream; the oldest ones end when it makes more than ``most``."""
        stream = Stream()
        with self._changed:
            self._open.append(stream)
            ended = self._open[: -self._most]
            del self._open[: -self._most]
            for old in ended:
                old.ended = True
            if ended:
                self._changed.notify_all()
        if ended:
            log.warning(
                "%s: %d ListAndWatch streams open (a kubelet keeps one): the oldest ended",
                self._resource,
                self._most + len(ended),
            )
        return stream

    def close(self, stream: Stream) -> None:
        with self._changed:
            stream.ended = True
            if stream in self._open:
                self._open.remove(stream)
            self._changed.notify_all()


class Serving:
    """The servers of ``names`` (resource names by kind) and their registration; ``start``, then
    ``stop``. The watcher is a thread of its own."""

    def __init__(
        self,
        folder: Path,
        names: Mapping[Kind, str],
        servicer: MakeServicer,
        *,
        poll_s: float,
        register_timeout_s: float,
    ) -> None:
        self.folder = folder
        self._names = dict(names)
        self._servicer = servicer
        self._poll_s = poll_s
        self._timeout_s = register_timeout_s
        self._servers: dict[Kind, grpc.Server] = {}
        self._fresh: set[Kind] = set()  # served, and no Register went through them yet
        self._registered: set[Kind] = set()
        self._kubelet_inode: int | None = None
        self._stopping = False
        self._wake = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="device-plugin", daemon=True)

    def socket_path(self, kind: Kind) -> Path:
        return self.folder / f"tf-hypervisor-{kind}.sock"

    def start(self) -> None:
        """Serve every resource and watch the kubelet's socket (registering when it is there)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for kind in self._names:
            self._serve(kind)
        self._watcher.start()

    def stop(self) -> None:
        """The watcher ended, then every server (their streams end with them)."""
        self._stopping = True
        self._wake.set()
        if self._watcher.is_alive():
            self._watcher.join(timeout=10)
        for kind in list(self._servers):
            self._shutdown(kind)

    def registered(self) -> bool:
        return len(self._registered) == len(self._names)

    def _watch(self) -> None:
        while not self._stopping:
            try:
                self._check_kubelet()
            except Exception as error:  # e.g. a socket that cannot be bound: tried again
                log.error("device plugin: %s: %s", type(error).__name__, error)
            self._wake.wait(self._poll_s)

    def _check_kubelet(self) -> None:
        """Serve again and register again what the kubelet does not have: every resource after
        it restarted, one whose socket is gone, one whose Register failed."""
        kubelet = self.folder / KUBELET_SOCKET
        inode = _inode(kubelet)
        if inode is None:  # no kubelet (yet): nothing to register with
            self._registered.clear()
            return
        if self._kubelet_inode is not None and inode != self._kubelet_inode:
            log.info("the kubelet's socket was made again: registering again")
            self._registered.clear()
        self._kubelet_inode = inode
        done = []
        for kind in self._names:
            if _inode(self.socket_path(kind)) is None:
                self._registered.discard(kind)
                self._fresh.discard(kind)
            if kind in self._registered or self._stopping:
                continue
            if kind not in self._fresh:
                self._serve(kind)
            if self._register(kubelet, kind):
                self._registered.add(kind)
                done.append(self._names[kind])
            else:
                # Now rather than before the next try: the kubelet has a while to take the end
                # of a stream it may have opened before the next Register reaches it.
                self._serve(kind)
        if done:
            log.info("registered %s with the kubelet", ", ".join(done))

    def _serve(self, kind: Kind) -> None:
        self._shutdown(kind)
        path = self.socket_path(kind)
        path.unlink(missing_ok=True)
        workers = futures.ThreadPoolExecutor(STREAMS + CONTROL, f"device-plugin-{kind}")
        server = grpc.server(workers)
        api_pb2_grpc.add_DevicePluginServicer_to_server(self._servicer(kind), server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        self._servers[kind] = server
        self._fresh.add(kind)

    def _shutdown(self, kind: Kind) -> None:
        self._fresh.discard(kind)
        server = self._servers.pop(kind, None)
        if server is not None:
            server.stop(grace=1).wait(5)
            self.socket_path(kind).unlink(missing_ok=True)

    def _register(self, kubelet: Path, kind: Kind) -> bool:
        self._fresh.discard(kind)
        name = self._names[kind]
        try:
            with grpc.insecure_channel(f"unix://{kubelet}") as channel:
                api_pb2_grpc.RegistrationStub(channel).Register(
                    api_pb2.RegisterRequest(
                        version=API_VERSION,
                        endpoint=self.socket_path(kind).name,
                        resource_name=name,
                        options=options(kind),
                    ),
                    timeout=self._timeout_s,
                )
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            detail = error.details() if isinstance(error, grpc.Call) else str(error)
            log.warning(
                "registering %s with the kubelet at %s failed: %s %s", name, kubelet, code, detail
            )
            return False
        return True


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None
