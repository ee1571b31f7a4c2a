"""The device plugin as the daemon runs it: built from the settings and the first GPU sample."""

from collections.abc import Sequence

from vgpu_hypervisor.daemon.pods import PodStore
from vgpu_hypervisor.device_plugin.accounting import LivePods
from vgpu_hypervisor.device_plugin.allocation import AllocationError, Layout, NodePods
from vgpu_hypervisor.device_plugin.prepare import Assign, store_preparer
from vgpu_hypervisor.device_plugin.resources import ResourceError
from vgpu_hypervisor.device_plugin.server import DevicePlugin, PluginConfig, PostEvent, inventory
from vgpu_hypervisor.gpu import NodeSnapshot, NotAvailable, nvml
from vgpu_hypervisor.kubernetes.annotations import NodeGpu
from vgpu_hypervisor.kubernetes.model import KubePod
from vgpu_hypervisor.kubernetes.setup import resource_names
from vgpu_hypervisor.settings import Settings


def _no_pod_source() -> Sequence[KubePod]:
    raise AllocationError(
        "the daemon does not watch this node's pods (--kubernetes), so no container's limits "
        "can be known"
    )


def minor_numbers(snapshot: NodeSnapshot) -> dict[str, int]:
    """GPU UUID → N of /dev/nvidiaN, for the GPUs whose driver says."""
    minors: dict[str, int] = {}
    with nvml.LOCK:
        for device in snapshot.devices:
            handle = nvml.device_handle(device.index)
            if not isinstance(device.uuid, str) or isinstance(handle, NotAvailable):
                continue
            minor = nvml.device_minor(handle)
            if isinstance(minor, int):
                minors[device.uuid] = minor
    return minors


def node_gpus(snapshot: NodeSnapshot) -> tuple[NodeGpu, ...]:
    """The GPUs as Allocate's limits need them: index, UUID, name, memory."""
    return tuple(
        NodeGpu(
            device.index,
            device.uuid,
            device.name if isinstance(device.name, str) else "",
            device.memory_total if isinstance(device.memory_total, int) else None,
        )
        for device in snapshot.devices
        if isinstance(device.uuid, str)
    )


def build_plugin(
    settings: Settings,
    snapshot: NodeSnapshot,
    store: PodStore,
    pods: NodePods | None,
    assign: Assign | None = None,
    *,
    live: LivePods | None = None,
    events: PostEvent | None = None,
) -> DevicePlugin:
    """The plugin (not started); ResourceError (one line) when it cannot advertise this node.
    ``live`` and ``events`` come from the pod source (DevicePlugin says what for)."""
    gpus = inventory(snapshot)
    if not gpus:
        raise ResourceError("the device plugin found no GPU to advertise")
    layout = Layout(
        host_lib_dir=settings.device_plugin_lib_dir,
        host_base=settings.shm_base_path,
        names=resource_names(settings),
        gpus=node_gpus(snapshot),
    )
    config = PluginConfig(
        layout,
        folder=settings.device_plugin_dir,
        shares=settings.gpu_shares,
        placement=settings.gpu_placement,
        pod_resources=settings.pod_resources_socket,
    )
    return DevicePlugin(
        config,
        gpus,
        pods or _no_pod_source,
        store_preparer(store, assign),
        minor_numbers(snapshot),
        live=live,
        events=events,
    )
