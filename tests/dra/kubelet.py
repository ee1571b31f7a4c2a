"""A stand-in kubelet for the DRA driver over real gRPC on unix sockets: its plugin watcher
(GetInfo on the registration socket, the version chosen among those offered, the outcome told)
and its calls of the node service, as the kubelet makes them."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from vgpu_hypervisor.dra.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)

from tests.dra.allocator import CLAIMS
from tests.hypervisor.conftest import wait_for
from tests.support.apiserver import ApiServer
from tests.support.apiserver.kinds import POD

VERSIONS = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub),
}


@dataclass
class Plugin:
    info: registration_pb2.PluginInfo
    version: str
    messages: Any
    stub: Any
    channel: grpc.Channel

    def prepare(self, *claims: tuple[str, str, str]) -> Any:
        """NodePrepareResources of (namespace, name, uid) claims."""
        request = self.messages.NodePrepareResourcesRequest(
            claims=[self.messages.Claim(namespace=n, name=c, uid=u) for n, c, u in claims]
        )
        return self.stub.NodePrepareResources(request, timeout=30)

    def unprepare(self, *claims: tuple[str, str, str]) -> Any:
        request = self.messages.NodeUnprepareResourcesRequest(
            claims=[self.messages.Claim(namespace=n, name=c, uid=u) for n, c, u in claims]
        )
        return self.stub.NodeUnprepareResources(request, timeout=30)


class DraKubelet:
    def __init__(self, registry: Path, versions: tuple[str, ...] = tuple(VERSIONS)) -> None:
        self.registry = registry
        self.versions = versions  # the services this kubelet speaks, preferred first
        self._channels: list[grpc.Channel] = []

    def register(self, timeout: float = 30) -> Plugin:
        """The plugin behind the one socket of the registry folder (once there), registered."""
        socket = self.wait_socket(timeout)
        channel = grpc.insecure_channel(f"unix://{socket}")
        self._channels.append(channel)
        registration = registration_pb2_grpc.RegistrationStub(channel)
        info = registration.GetInfo(registration_pb2.InfoRequest(), timeout=10)
        assert info.type == "DRAPlugin", info
        version = next(v for v in self.versions if v in info.supported_versions)
        registration.NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=True), timeout=10
        )
        service = grpc.insecure_channel(f"unix://{info.endpoint}")
        self._channels.append(service)
        messages, stub = VERSIONS[version]
        return Plugin(info, version, messages, stub(service), service)

    def wait_socket(self, timeout: float = 30) -> Path:
        """The one socket of the registry folder, as the plugin watcher finds it."""
        (socket,) = wait_for(
            lambda: [p for p in self.registry.iterdir() if p.is_socket()], timeout=timeout
        )
        socket_path: Path = socket
        return socket_path

    def restart(self) -> None:
        """As a kubelet that starts again with an empty registry folder: its connections
        closed, every socket there removed."""
        self.close()
        for path in self.registry.iterdir():
            if path.is_socket():
                path.unlink()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels.clear()


def stop_pod(api: ApiServer, plugin: Plugin, namespace: str, name: str) -> None:
    """The kubelet's part in deleting a pod of its node: once the pod is being deleted, its
    containers stopped, its claims (those its status names, from templates and for extended
    resources, and those its spec names) unprepared unless another pod holds one too, then the
    pod's last delete (grace 0)."""
    pod = api.store.get(POD, namespace, name)
    assert pod["metadata"].get("deletionTimestamp"), f"pod {namespace}/{name} is not being deleted"
    status = pod.get("status", {})
    names = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses", [])]
    names += [c["resourceClaimName"] for c in pod["spec"].get("resourceClaims", [])
              if c.get("resourceClaimName")]  # fmt: skip
    if "extendedResourceClaimStatus" in status:
        names.append(status["extendedResourceClaimStatus"]["resourceClaimName"])
    uid = pod["metadata"]["uid"]
    claims = [api.store.get(CLAIMS, namespace, claim) for claim in names]
    # A claim another pod holds too stays prepared for that pod.
    alone = [
        c
        for c in claims
        if all(r["uid"] == uid for r in c.get("status", {}).get("reservedFor", []))
    ]
    refs = [(namespace, c["metadata"]["name"], c["metadata"]["uid"]) for c in alone]
    if refs:
        answers = plugin.unprepare(*refs).claims
        errors = [answers[claim].error for _, _, claim in refs if answers[claim].error]
        assert not errors, errors  # the kubelet would ask again; the pod stays until then
    api.store.delete(POD, namespace, name, grace=0, uid=uid)
