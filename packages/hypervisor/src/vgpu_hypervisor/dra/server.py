"""The kubelet's side of the driver: two gRPC servers on unix sockets.

- ``{registry}/gpu.vgpu.io-reg.sock``: plugin registration v1. The kubelet's plugin watcher
  finds the socket, asks GetInfo (a DRAPlugin named gpu.vgpu.io, its endpoint, the DRA service
  versions served) and tells the outcome (NotifyRegistrationStatus).
- ``{plugins}/gpu.vgpu.io/dra.sock``: the DRA node service, v1 (kubelet 1.34 and later) and
  v1beta1 (earlier kubelets), both answered by the one Preparer.

A kubelet that restarts may have emptied its folders: the driver checks its two sockets every
``poll_s`` and serves again on one that is gone or was replaced (another file at its path), so
the kubelet's plugin watcher finds the registration socket again and registers the driver anew
(GetInfo, NotifyRegistrationStatus). A socket left in place needs nothing: the restarted
kubelet's watcher finds it and registers it.

A claim that cannot be prepared is answered with its error (one line: the kubelet puts it in
the pod's events) and the others are prepared; the kubelet asks again for the failed ones.
"""

import logging
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import grpc

from vgpu_hypervisor.daemon.pods import PodError
from vgpu_hypervisor.dra.claims import DRIVER, ClaimError
from vgpu_hypervisor.dra.config import ConfigError
from vgpu_hypervisor.dra.prepare import Preparer
from vgpu_hypervisor.dra.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)

log = logging.getLogger("vgpu_hypervisor.dra")
PLUGIN_TYPE: Final = "DRAPlugin"
SERVICES: Final = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
DEFAULT_REGISTRY: Final = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS: Final = Path("/var/lib/kubelet/plugins")
_EXPECTED: Final = (ClaimError, ConfigError, PodError, OSError)


@dataclass(frozen=True)
class SocketConfig:
    registry: Path = DEFAULT_REGISTRY
    plugins: Path = DEFAULT_PLUGINS

    @property
    def registration_socket(self) -> Path:
        return self.registry / f"{DRIVER}-reg.sock"

    @property
    def service_socket(self) -> Path:
        return self.plugins / DRIVER / "dra.sock"


@dataclass
class _Serving:
    server: grpc.Server
    path: Path
    inode: int | None  # of the socket file it bound


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


class _Registration(registration_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: "DraDriver") -> None:
        self._driver = driver

    def GetInfo(
        self, request: registration_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> registration_pb2.PluginInfo:
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRIVER,
            endpoint=str(self._driver.sockets.service_socket),
            supported_versions=list(SERVICES),
        )

    def NotifyRegistrationStatus(
        self, request: registration_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> registration_pb2.RegistrationStatusResponse:
        self._driver.note_registration(request.plugin_registered, request.error)
        return registration_pb2.RegistrationStatusResponse()


def _node_service(messages: ModuleType, base: type, with_share_id: bool) -> type:
    """The DRAPlugin servicer of one API version (its messages in ``messages``)."""

    class Servicer(base):  # type: ignore[misc]  # a generated class, per version
        def __init__(self, preparer: Preparer) -> None:
            self._preparer = preparer

        def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            answers = {}
            for claim in request.claims:
                answer = messages.NodePrepareResourceResponse()
                error = _attempt("prepare", claim, self._preparer.prepare)
                if isinstance(error, str):
                    answer.error = error
                else:
                    for one in error:
                        device = messages.Device(
                            # The request a container names: a subrequest of firstAvailable
                            # ("gpu/small") is named by its request ("gpu"), and the kubelet
                            # gives a container only the devices of the requests it names.
                            # Before, such a claim's containers got none of the driver's.
                            request_names=[one.share.request.split("/", 1)[0]],
                            pool_name=one.share.pool,
                            device_name=one.share.device,
                            cdi_device_ids=list(one.cdi_ids),
                        )
                        if with_share_id and one.share.share_id is not None:
                            device.share_id = one.share.share_id
                        answer.devices.append(device)
                answers[claim.uid] = answer
            return messages.NodePrepareResourcesResponse(claims=answers)

        def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            answers = {}
            for claim in request.claims:
                error = _attempt("unprepare", claim, self._preparer.unprepare)
                answers[claim.uid] = messages.NodeUnprepareResourceResponse(
                    error=error if isinstance(error, str) else ""
                )
            return messages.NodeUnprepareResourcesResponse(claims=answers)

    return Servicer


def _attempt(verb: str, claim: Any, work: Callable[[str, str, str], Any]) -> Any:
    """``work`` of the claim (namespace, name, UID), or its error as one line (logged)."""
    try:
        return work(claim.namespace, claim.name, claim.uid)
    except _EXPECTED as error:
        message = f"{verb} claim {claim.namespace}/{claim.name}: {error}"
    except Exception as error:  # a bug or the API client: still one line to the kubelet
        message = f"{verb} claim {claim.namespace}/{claim.name}: {type(error).__name__}: {error}"
        log.debug("%s", message, exc_info=True)
    log.warning("%s", message)
    return message


_V1 = _node_service(dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginServicer, with_share_id=True)
_V1BETA1 = _node_service(
    dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginServicer, with_share_id=False
)


class DraDriver:
    """The registration and node-service servers; ``start`` then ``stop``."""

    def __init__(
        self, preparer: Preparer, sockets: SocketConfig = SocketConfig(), poll_s: float = 1.0
    ) -> None:
        self.preparer = preparer
        self.sockets = sockets
        self.poll_s = poll_s
        self.registered = threading.Event()
        self.registration_error = ""
        self._serving: dict[str, _Serving] = {}  # "service", "registration"
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def note_registration(self, registered: bool, error: str) -> None:
        self.registration_error = error
        if registered:
            log.info("registered with the kubelet as %s", DRIVER)
            self.registered.set()
        else:
            log.error("the kubelet refused the registration of %s: %s", DRIVER, error)
            self.registered.clear()

    def start(self) -> None:
        """Serve the node service first, then the registration the kubelet looks for; watch
        both sockets."""
        self._serve_service()
        self._serve_registration()
        self._stopping.clear()
        self._watcher = threading.Thread(target=self._watch, name="dra-sockets", daemon=True)
        self._watcher.start()

    def _serve_service(self) -> None:
        service = self._server("service", self.sockets.service_socket)
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_V1(self.preparer), service)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(_V1BETA1(self.preparer), service)
        self._begin("service", service)

    def _serve_registration(self) -> None:
        registration = self._server("registration", self.sockets.registration_socket)
        registration_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)
        self.registered.clear()  # until the kubelet says so again
        self._begin("registration", registration)

    def _server(self, role: str, path: Path) -> grpc.Server:
        self._end(role)
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # left by a daemon that did not stop cleanly
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_insecure_port(f"unix://{path}")
        self._serving[role] = _Serving(server, path, None)
        return server

    def _begin(self, role: str, server: grpc.Server) -> None:
        server.start()
        serving = self._serving[role]
        serving.inode = _inode(serving.path)

    def _end(self, role: str) -> None:
        serving = self._serving.pop(role, None)
        if serving is None:
            return
        serving.server.stop(grace=1).wait(5)
        if _inode(serving.path) == serving.inode:  # ours still, not a newer file
            serving.path.unlink(missing_ok=True)

    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_s):
            try:
                self._check_sockets()
            except Exception as error:  # e.g. a folder that cannot be made: tried again
                log.error("DRA driver: %s: %s", type(error).__name__, error)

    def _check_sockets(self) -> None:
        """Serve again on a socket that is gone or replaced; the service first, so that a
        registration served again already has its endpoint there."""
        gone = [
            role
            for role, serving in self._serving.items()
            if serving.inode is None or _inode(serving.path) != serving.inode
        ]
        if "service" in gone:
            log.info("the DRA service socket %s is gone: serving it again", self._path("service"))
            self._serve_service()
        if "registration" in gone:
            log.info(
                "the registration socket %s is gone (a kubelet restart): serving it again",
                self._path("registration"),
            )
            self._serve_registration()

    def _path(self, role: str) -> Path:
        return self._serving[role].path

    def stop(self) -> None:
        """Registration first (the kubelet stops calling), then the node service."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
            self._watcher = None
        for role in ("registration", "service"):
            self._end(role)
