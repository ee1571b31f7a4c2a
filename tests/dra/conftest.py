"""The DRA driver on a simulated node: its libraries, device files and base path (as the
device plugin's tests make them), the API-server stand-in holding pods, classes, claims and
slices, a stand-in kubelet."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from vgpu_hypervisor.device_plugin.runner import node_gpus
from vgpu_hypervisor.dra.claims import DRIVER
from vgpu_hypervisor.dra.inventory import NodeFacts, read_facts
from vgpu_hypervisor.dra.kube import ApiClaims, open_client
from vgpu_hypervisor.dra.prepare import NodeConfig, Preparer
from vgpu_hypervisor.dra.server import DraDriver, SocketConfig
from vgpu_hypervisor.gpu import GpuObserver, NodeSnapshot

# The simulated node's fixtures, shared with the device plugin's tests.
from tests.device_plugin.conftest import Node, running_node
from tests.dra.kubelet import DraKubelet, Plugin
from tests.support.apiserver import ApiServer, Kind
from tests.support.apiserver.kinds import BUILTIN, POD
from tests.support.apiserver.kinds import NAMESPACE as NAMESPACES
from tests.support.apiserver.selectors import Selector

NODE = "node-1"
NAMESPACE = "team"
GiB = 1 << 30


def resource_kind(plural: str) -> Kind:
    """The stand-in's resource.k8s.io/v1 kind of this plural."""
    (kind,) = [k for k in BUILTIN if (k.group, k.plural) == ("resource.k8s.io", plural)]
    return kind


DEVICE_CLASSES = resource_kind("deviceclasses")
CLAIMS = resource_kind("resourceclaims")
CLAIM_TEMPLATES = resource_kind("resourceclaimtemplates")
SLICES = resource_kind("resourceslices")


def objects(api: ApiServer, kind: Kind, namespace: str | None = None) -> list[dict[str, Any]]:
    """The objects of ``kind`` the API server holds (in ``namespace``; None: all)."""
    items, _ = api.store.select(kind, namespace, Selector((), ()))
    return sorted(items, key=lambda o: o["metadata"]["name"])


def serve_namespace(api: ApiServer, name: str = NAMESPACE) -> None:
    api.store.create(NAMESPACES, None, {"metadata": {"name": name}}, strict=True, dry_run=False)


@dataclass
class DraNode:
    node: Node  # libraries, device files, base path and PodStore
    api: ApiServer
    config: NodeConfig
    sockets: SocketConfig
    driver: DraDriver | None = None

    @property
    def cdi_dir(self) -> Path:
        return self.config.cdi_dir

    def start(self) -> DraDriver:
        """The driver, started (again, as a daemon that restarts)."""
        client = open_client(str(self.api.kubeconfig(self.node.root / "kubeconfig")))
        preparer = Preparer(self.config, self.node.store, ApiClaims(client))
        self.driver = DraDriver(preparer, self.sockets)
        self.driver.start()
        return self.driver

    def stop(self) -> None:
        if self.driver is not None:
            self.driver.stop()
            self.driver = None

    def add_pod(self, name: str, **security: int) -> dict[str, Any]:
        return put_pod(self.api, name, **security)

    def add_claim(
        self, name: str, pod: dict[str, Any], devices: list[dict[str, Any]], **status: Any
    ) -> dict[str, Any]:
        return put_claim(self.api, name, pod, devices, **status)


def put_pod(api: ApiServer, name: str, **security: int) -> dict[str, Any]:
    """A pod of this node in the API server."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "cuda"}],
            "securityContext": security,
        },
    }
    return api.store.put(POD, NAMESPACE, pod)


def put_claim(
    api: ApiServer, name: str, pod: dict[str, Any], devices: list[dict[str, Any]], **status: Any
) -> dict[str, Any]:
    """A claim allocated ``devices`` (request, device, consumed capacity) and reserved for
    ``pod``, as the scheduler leaves it."""
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, **device} for device in devices]
    consumer = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
        },
        "status": {
            "allocation": {"devices": {"results": results, **status}},
            "reservedFor": [consumer],
        },
    }
    return api.store.put(CLAIMS, NAMESPACE, claim)


@contextmanager
def dra_node(root: Path, snapshot: NodeSnapshot) -> Iterator[DraNode]:
    # Pods being deleted wait for the stand-in kubelet (kubelet.stop_pod) to stop them.
    with running_node(root, snapshot) as node, ApiServer(stop_pods_s=None) as api:
        serve_namespace(api)
        gpus = node_gpus(snapshot)
        config = NodeConfig(
            node.layout,
            NODE,
            gpus,
            {gpu.uuid: gpu.index for gpu in gpus},
            cdi_dir=root / "cdi",
            nvidia_cdi_dirs=(root / "etc-cdi",),
        )
        made = DraNode(node, api, config, SocketConfig(root / "registry", root / "plugins"))
        try:
            yield made
        finally:
            made.stop()


@pytest.fixture(scope="module")
def facts(sim_state: Path, snapshot: NodeSnapshot) -> NodeFacts:
    """What the driver publishes of the simulated node."""
    with GpuObserver.open(simulate=True, sim_state=sim_state) as observer:
        return read_facts(observer.sample(), observer.backend)


@pytest.fixture
def dra(tmp_path: Path, snapshot: NodeSnapshot) -> Iterator[DraNode]:
    with dra_node(tmp_path, snapshot) as made:
        made.start()
        yield made


@pytest.fixture
def plugin(dra: DraNode) -> Iterator[Plugin]:
    kubelet = DraKubelet(dra.sockets.registry)
    try:
        yield kubelet.register()
    finally:
        kubelet.close()
