"""The DRA driver as the daemon runs it (--dra): built from the settings, the first GPU sample
and the backend; the node's ResourceSlice follows the GPUs' health at every sample."""

import logging
from pathlib import Path

from vgpu_hypervisor.daemon.pods import PodStore
from vgpu_hypervisor.device_plugin.allocation import Layout
from vgpu_hypervisor.device_plugin.server import healthy_gpus
from vgpu_hypervisor.dra.cdi import NVIDIA_FOLDERS
from vgpu_hypervisor.dra.inventory import NodeFacts, minors, read_facts
from vgpu_hypervisor.dra.kube import ApiClaims, KubeError, open_client
from vgpu_hypervisor.dra.prepare import NodeConfig, Preparer
from vgpu_hypervisor.dra.publish import SlicePublisher
from vgpu_hypervisor.dra.server import DraDriver, SocketConfig
from vgpu_hypervisor.gpu import NodeSnapshot
from vgpu_hypervisor.gpu.backend import BackendInfo
from vgpu_hypervisor.kubernetes.annotations import NodeGpu
from vgpu_hypervisor.settings import Settings

log = logging.getLogger("vgpu_hypervisor.dra")


class DraRunning:
    """The servers and the slice; ``start``, ``update_health`` per sample, ``stop``."""

    def __init__(self, driver: DraDriver, publisher: SlicePublisher, facts: NodeFacts) -> None:
        self.driver = driver
        self.publisher = publisher
        self.facts = facts

    def start(self, snapshot: NodeSnapshot) -> None:
        self.driver.start()
        self.update_health(snapshot)

    def update_health(self, snapshot: NodeSnapshot) -> None:
        """The slice lists the GPUs healthy in ``snapshot`` (written when that changed)."""
        health = healthy_gpus([gpu.uuid for gpu in self.facts.gpus], snapshot)
        try:
            written = self.publisher.publish(uuid for uuid, healthy in health.items() if healthy)
        except KubeError as error:  # tried again at the next sample
            log.error("%s", error)
            return
        unhealthy = [uuid for uuid, healthy in health.items() if not healthy]
        if written and unhealthy:
            how = "tainted" if self.publisher.taints else "left out"
            log.warning("ResourceSlice: unhealthy GPU(s) %s: %s", how, ", ".join(unhealthy))
        elif written:
            log.info("ResourceSlice: every GPU published (%d)", len(health))

    def stop(self) -> None:
        self.driver.stop()


def build_driver(
    settings: Settings, snapshot: NodeSnapshot, backend: BackendInfo, store: PodStore
) -> DraRunning:
    """The driver (not started); KubeError (one line) when it cannot run on this node."""
    if not settings.node_name:
        raise KubeError("--dra needs the node's name (--node-name or NODE_NAME)")
    facts = read_facts(snapshot, backend)
    if not facts.gpus:
        raise KubeError("the DRA driver found no GPU to publish")
    client = open_client(str(settings.kubeconfig) if settings.kubeconfig else None)
    layout = Layout(host_lib_dir=settings.device_plugin_lib_dir, host_base=settings.shm_base_path)
    config = NodeConfig(
        layout,
        settings.node_name,
        tuple(NodeGpu(gpu.index, gpu.uuid, gpu.name, gpu.memory) for gpu in facts.gpus),
        minors(facts.gpus),
        cdi_dir=Path(settings.cdi_dir),
        nvidia_cdi_dirs=tuple(dict.fromkeys((*NVIDIA_FOLDERS, Path(settings.cdi_dir)))),
    )
    preparer = Preparer(config, store, ApiClaims(client))
    sockets = SocketConfig(settings.dra_registry_dir, settings.dra_plugins_dir)
    return DraRunning(
        DraDriver(preparer, sockets), SlicePublisher(client, settings.node_name, facts), facts
    )
