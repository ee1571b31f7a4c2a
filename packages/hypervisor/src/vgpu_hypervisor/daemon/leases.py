"""The node's device leases, arbitrated by the daemon (vgpu_limiter.lease_broker): every paced
process connects to the node folder's socket and gets each GPU's lease from the daemon's arbiter,
sharing no writable word with another pod. Without it (no memfd, a node folder the daemon cannot
use) paced processes fall back to the lease files, which the daemon says once."""

import logging
from pathlib import Path

from vgpu_limiter.lease_broker import LeaseBroker
from vgpu_limiter.region import RegionError

from vgpu_hypervisor.gpu import NOT_AVAILABLE, nvml
from vgpu_hypervisor.gpu.backend import BackendInfo

log = logging.getLogger(__name__)


def gpu_uuids(backend: BackendInfo) -> list[str]:
    """The UUIDs of the node's GPUs that NVML names (one whose UUID cannot be read is not
    arbitrated: its pods pace with the lease file)."""
    uuids = []
    with nvml.LOCK:
        for index in range(backend.device_count):
            handle = nvml.device_handle(index)
            uuid = nvml.device_uuid(handle) if handle is not NOT_AVAILABLE else NOT_AVAILABLE
            if isinstance(uuid, str):
                uuids.append(uuid)
    return uuids


def start_lease_broker(base: Path, backend: BackendInfo, context_charge: int) -> LeaseBroker | None:
    """The arbiter of every GPU's lease, serving from now on, with the node's context charge
    published; None (and a warning) when it cannot be started."""
    try:
        broker = LeaseBroker(base, gpu_uuids(backend), context_charge)
    except (OSError, ValueError) as error:
        log.warning("no device lease arbiter (%s): paced pods use the lease files", error)
        return None
    try:
        broker.start()
    except (OSError, RegionError, ValueError) as error:
        broker.close()
        log.warning("no device lease arbiter (%s): paced pods use the lease files", error)
        return None
    log.info("device leases of %d GPU(s) arbitrated on %s", len(broker.uuids), broker.path)
    return broker
