"""The node's sealed device leases (vgpu_limiter.lease_broker): one per GPU, handed to every
paced process through the node folder's socket, their headers repaired when a sharer scribbles
them. Without them (no memfd, a node folder the daemon cannot use) paced processes fall back
to the lease files, which the daemon says once."""

import logging
from pathlib import Path

from vgpu_limiter.lease_broker import LeaseBroker
from vgpu_limiter.region import RegionError

from vgpu_hypervisor.gpu import NOT_AVAILABLE, nvml
from vgpu_hypervisor.gpu.backend import BackendInfo

log = logging.getLogger(__name__)


def gpu_uuids(backend: BackendInfo) -> list[str]:
    """The UUIDs of the node's GPUs that NVML names (one whose UUID cannot be read has no
    sealed lease: its pods pace with the lease file)."""
    uuids = []
    with nvml.LOCK:
        for index in range(backend.device_count):
            handle = nvml.device_handle(index)
            uuid = nvml.device_uuid(handle) if handle is not NOT_AVAILABLE else NOT_AVAILABLE
            if isinstance(uuid, str):
                uuids.append(uuid)
    return uuids


class RepairingBroker(LeaseBroker):
    def repair(self) -> list[str]:
        repaired = super().repair()
        for uuid in repaired:
            log.warning("device lease of %s: its header was overwritten; stamped again", uuid)
        return repaired


def start_lease_broker(base: Path, backend: BackendInfo) -> LeaseBroker | None:
    """The leases of every GPU, handed out from now on; None (and a warning) when they cannot be."""
    try:
        broker = RepairingBroker(base, gpu_uuids(backend))
    except (OSError, ValueError) as error:
        log.warning("no sealed device leases (%s): paced pods use the lease files", error)
        return None
    try:
        broker.start()
    except (OSError, RegionError, ValueError) as error:
        broker.close()
        log.warning("no sealed device leases (%s): paced pods use the lease files", error)
        return None
    log.info("device leases of %d GPU(s) handed out on %s", len(broker.uuids), broker.path)
    return broker
