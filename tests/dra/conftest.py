"""The DRA driver on a simulated node: its libraries, device files and base path (as the
device plugin's tests make them), a small API server holding pods and claims, a stand-in
kubelet."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from vgpu_hypervisor.device_plugin.runner import node_gpus
from vgpu_hypervisor.dra.claims import DRIVER
from vgpu_hypervisor.dra.kube import ApiClaims, open_client
from vgpu_hypervisor.dra.prepare import NodeConfig, Preparer
from vgpu_hypervisor.dra.server import DraDriver, SocketConfig
from vgpu_hypervisor.gpu import NodeSnapshot

# The simulated node's fixtures, shared with the device plugin's tests.
from tests.device_plugin.conftest import Node, running_node
from tests.dra.apiserver import Store, api_server
from tests.dra.kubelet import DraKubelet, Plugin

NODE = "node-1"
NAMESPACE = "team"
GiB = 1 << 30
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"


@dataclass
class DraNode:
    node: Node  # libraries, device files, base path and PodStore
    api: Store
    url: str
    config: NodeConfig
    sockets: SocketConfig
    driver: DraDriver | None = None

    @property
    def cdi_dir(self) -> Path:
        return self.config.cdi_dir

    def start(self) -> DraDriver:
        """The driver, started (again, as a daemon that restarts)."""
        client = open_client(str(kubeconfig(self.node.root, self.url)))
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


def put_pod(api: Store, name: str, **security: int) -> dict[str, Any]:
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
    return api.put(PODS, pod)


def put_claim(
    api: Store, name: str, pod: dict[str, Any], devices: list[dict[str, Any]], **status: Any
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
    return api.put(CLAIMS, claim)


def kubeconfig(folder: Path, url: str) -> Path:
    """A kubeconfig of the API server at ``url``."""
    path = folder / "kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": url}}],
        "users": [{"name": "node", "user": {"token": "node-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "node"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextmanager
def dra_node(root: Path, snapshot: NodeSnapshot) -> Iterator[DraNode]:
    with running_node(root, snapshot) as node, api_server() as (url, store):
        gpus = node_gpus(snapshot)
        config = NodeConfig(
            node.layout,
            NODE,
            gpus,
            {gpu.uuid: gpu.index for gpu in gpus},
            cdi_dir=root / "cdi",
        )
        made = DraNode(node, store, url, config, SocketConfig(root / "registry", root / "plugins"))
        try:
            yield made
        finally:
            made.stop()


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
