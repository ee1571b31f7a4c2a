"""A device plugin on a simulated node, with a stand-in kubelet and the pods the pod source
knows; ``admit`` has the kubelet admit one and waits until its allocations are bound."""

import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
from vgpu_add_path import library_path as add_path_library
from vgpu_hypervisor.daemon.pods import PodStore
from vgpu_hypervisor.device_plugin.accounting import Placement
from vgpu_hypervisor.device_plugin.allocation import Layout, NodePods
from vgpu_hypervisor.device_plugin.binding import REGION, Allocation
from vgpu_hypervisor.device_plugin.prepare import store_preparer
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.device_plugin.runner import node_gpus
from vgpu_hypervisor.device_plugin.server import (
    PREFERRED_WAIT_S,
    DevicePlugin,
    PluginConfig,
    inventory,
)
from vgpu_hypervisor.gpu import NodeSnapshot
from vgpu_hypervisor.kubernetes.annotations import ResourceNames
from vgpu_hypervisor.kubernetes.model import KubeContainer, KubePod
from vgpu_limiter import library_path as limiter_library

from tests.device_plugin.kubelet import Container, FakeKubelet, Pod
from tests.hypervisor.conftest import wait_for

SHARES = 4
GiB = 1 << 30


def gpu_pod(
    name: str,
    gpus: int,
    created: str,
    *,
    memory: int = 0,
    compute: int = 0,
    phase: str = "Pending",
) -> KubePod:
    resources = {"vgpu.io/gpu": str(gpus)}
    if memory:
        resources["vgpu.io/gpu-memory"] = str(memory)
    if compute:
        resources["vgpu.io/gpu-compute"] = str(compute)
    return KubePod(
        namespace="team",
        name=name,
        uid=f"uid-{name}",
        node_name="node-1",
        phase=phase,
        resource_version="1",
        created=created,
        containers=(KubeContainer("main", resources),),
    )


@dataclass
class Node:
    root: Path
    kubelet: FakeKubelet
    layout: Layout
    store: PodStore
    pods: list[KubePod] = field(default_factory=list)
    # The events the plugin posted: (pod key, reason, message).
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def live(self) -> set[str]:
        """The pods whose devices the kubelet still holds: those listed, not ended."""
        return {pod.uid for pod in self.pods if pod.phase not in ("Succeeded", "Failed")}

    def post(self, pod: KubePod, reason: str, message: str) -> None:
        self.events.append((pod.key, reason, message))


@contextmanager
def running_node(
    root: Path, snapshot: NodeSnapshot, names: ResourceNames | None = None
) -> Iterator[Node]:
    """A node under ``root``: the libraries, device files, base path and a stand-in kubelet."""
    lib = root / "lib"
    lib.mkdir()
    shutil.copy(add_path_library(), lib / "libadd_path.so")
    shutil.copy(limiter_library(), lib / "libcuda_limiter.so")
    dev = root / "dev"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"):
        (dev / name).touch()
    layout = Layout(
        host_lib_dir=lib,
        host_base=root / "shm",
        dev_root=dev,
        names=names or ResourceNames(memory_unit=GiB),
        gpus=node_gpus(snapshot),
    )
    layout.host_base.mkdir()
    store = PodStore(layout.host_base)
    kubelet = FakeKubelet(root / "device-plugins")
    kubelet.start()
    try:
        yield Node(root, kubelet, layout, store)
    finally:
        kubelet.stop()
        store.close()


@contextmanager
def serving(
    node: Node,
    snapshot: NodeSnapshot,
    placement: Placement = "binpack",
    bind_every_s: float = 0.05,
    *,
    preferred_wait_s: float = PREFERRED_WAIT_S,
    pods: NodePods | None = None,
) -> Iterator[DevicePlugin]:
    """The plugin of ``node``, started, its pods those of ``node.pods`` (or ``pods``'); its
    binder looks at the kubelet's list every ``bind_every_s`` while an allocation is unbound;
    GetPreferredAllocation waits ``preferred_wait_s`` for a pod the pod source does not show."""
    config = PluginConfig(
        node.layout,
        folder=node.kubelet.folder,
        shares=SHARES,
        poll_s=0.1,
        placement=placement,
        preferred_wait_s=preferred_wait_s,
        pod_resources=node.kubelet.pod_resources,
        bind_poll_s=bind_every_s,
        bind_idle_s=max(0.2, bind_every_s),
        forget_s=0.5,
    )
    minors = {gpu.uuid: index for index, gpu in enumerate(inventory(snapshot))}
    running = DevicePlugin(
        config,
        inventory(snapshot),
        pods or (lambda: node.pods),
        store_preparer(node.store),
        minors,
        live=node.live,
        events=node.post,
    )
    running.start()
    try:
        yield running
    finally:
        running.stop()


def kubelet_pod(pod: KubePod, init: tuple[Container, ...] = ()) -> Pod:
    """The pod as the kubelet admits it: ``init`` containers, then the pod's own."""
    own = tuple(
        Container(c.name, {name: int(count) for name, count in c.resources.items()})
        for c in pod.containers
    )
    return Pod(pod.namespace, pod.name, pod.uid, (*init, *own))


def allocation_of(plugin: DevicePlugin, answer: api_pb2.ContainerAllocateResponse) -> Allocation:
    """The allocation whose folder the answer mounts."""
    (folder,) = [m.host_path for m in answer.mounts if m.container_path.endswith("/shm/pod")]
    found = plugin.bindings.get(Path(folder).name)
    assert found is not None
    return found


def wait_bound(
    plugin: DevicePlugin, answers: dict[str, api_pb2.ContainerAllocateResponse]
) -> dict[str, Allocation]:
    """Each container's allocation once the binder has bound it and, unless its pod was
    refused, linked its pod's region into its folder (the binding is kept first, so that a
    daemon stopped between the two still knows it: the link follows a moment later)."""

    def bound(answer: api_pb2.ContainerAllocateResponse) -> Allocation | None:
        allocation = allocation_of(plugin, answer)
        if allocation.pod is None:
            return None
        if allocation.refused or (plugin.bindings.path(allocation.id) / REGION).exists():
            return allocation
        return None

    return {name: wait_for(partial(bound, a), timeout=30) for name, a in answers.items()}


def admit(
    node: Node,
    plugin: DevicePlugin,
    pod: KubePod,
    init: tuple[Container, ...] = (),
    choose: Mapping[tuple[str, str], list[str]] | None = None,
) -> dict[str, api_pb2.ContainerAllocateResponse]:
    """The kubelet admits the pod (known to the pod source): each GPU container's answer, once
    its allocation is bound (or refused). ``choose``: as FakeKubelet.admit's."""
    if pod not in node.pods:
        node.pods.append(pod)
    if not node.kubelet.plugins:
        node.kubelet.connect()
    answers = node.kubelet.admit(kubelet_pod(pod, init), choose)
    gpus = {n for n, a in answers.items() if a.envs}
    wait_bound(plugin, {n: answers[n] for n in gpus})
    return {n: answers[n] for n in gpus}


@pytest.fixture
def node(tmp_path: Path, snapshot: NodeSnapshot) -> Iterator[Node]:
    with running_node(tmp_path, snapshot) as made:
        yield made


@pytest.fixture
def plugin(node: Node, snapshot: NodeSnapshot) -> Iterator[DevicePlugin]:
    with serving(node, snapshot) as running:
        yield running
