"""The node's device leases, arbitrated by the daemon (vgpu_limiter.lease_broker): every paced
process connects to the node folder's socket and gets each GPU's lease from the daemon's arbiter,
sharing no writable word with another pod. A process is served a GPU's lease only while it holds
that GPU's device file open, as every process with a context there does: a container is given
its own GPUs' devices alone, so no pod takes turns on a GPU it was not given. Without the
arbiter (no memfd, a node folder the daemon cannot use) paced processes fall back to the lease
files, which the daemon says once."""

import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from vgpu_limiter.lease_broker import LeaseBroker
from vgpu_limiter.region import RegionError

from vgpu_hypervisor.gpu import NOT_AVAILABLE, nvml
from vgpu_hypervisor.gpu.backend import BackendInfo

log = logging.getLogger(__name__)
NVIDIA_MAJOR: Final = 195  # the character devices /dev/nvidia0, /dev/nvidia1, …


def gpu_devices(backend: BackendInfo) -> dict[str, int | None]:
    """The node's GPUs that NVML names, by UUID, each with its character device's number (the
    ``st_rdev`` of its /dev/nvidiaN; None on the simulated GPU, or where NVML gives no minor
    number). A GPU whose UUID cannot be read is not arbitrated: its pods pace with the lease
    file."""
    devices: dict[str, int | None] = {}
    with nvml.LOCK:
        for index in range(backend.device_count):
            handle = nvml.device_handle(index)
            if handle is NOT_AVAILABLE:
                continue
            uuid = nvml.device_uuid(handle)
            minor = nvml.device_minor_number(handle) if backend.backend != "simulated" else None
            if isinstance(uuid, str):
                devices[uuid] = device_number(minor) if isinstance(minor, int) else None
    return devices


def device_number(minor: int) -> int:
    """The device number of /dev/nvidia{minor}: as the file says where the daemon sees it, else
    the driver's (its character devices' major is 195, fixed by the driver)."""
    with contextlib.suppress(OSError):
        info = Path(f"/dev/nvidia{minor}").stat()
        if stat.S_ISCHR(info.st_mode):
            return info.st_rdev
    return os.makedev(NVIDIA_MAJOR, minor)


def start_lease_broker(base: Path, backend: BackendInfo, context_charge: int) -> LeaseBroker | None:
    """The arbiter of every GPU's lease, serving from now on, with the node's context charge
    published; None (and a warning) when it cannot be started."""
    devices = gpu_devices(backend)
    untied = [uuid for uuid, device in devices.items() if device is None]
    if untied and backend.backend != "simulated":
        log.warning(
            "GPU %s: no device number from NVML: any local process may take turns of its lease",
            ", ".join(untied),
        )
    try:
        broker = LeaseBroker(
            base,
            list(devices),
            context_charge,
            {uuid: device for uuid, device in devices.items() if device is not None},
        )
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


STRANGERS_EVERY_S: Final = 10.0


class StrangerWatch:
    """Says, at most every STRANGERS_EVERY_S, how many HELLOs for a GPU's lease came from
    processes that did not hold the GPU's device open since it last said (the arbiter counts
    them): a tenant trying a GPU its pod was not given, or a daemon that cannot read other
    users' /proc/PID/fd, which an operator must hear of, as its pods then pace with leases of
    their own. Requests, not processes: a process refused asks again every second (lease.c)."""

    def __init__(self, broker: LeaseBroker) -> None:
        self.broker = broker
        self.said = 0

    def tick(self) -> None:
        strangers = self.broker.stats().strangers
        if strangers > self.said:
            log.warning(
                "%d request(s) for a GPU's lease without holding the GPU's device file open: "
                "not served (a refused process asks again every second; a process of a pod not "
                "given that GPU, or this daemon cannot read their /proc/PID/fd: it needs the "
                "host's /proc and CAP_SYS_PTRACE)",
                strangers - self.said,
            )
            self.said = strangers


NEWCOMER_SETTLE_S: Final = 0.1
"""How long after the arbiter saw a pod wake the pass that counts it comes: long enough for the
pod's first wait for the lease (up to a 32-ms epoch of another pod's) to end and move its
counters, without which the pass would not see it wanting the GPU."""


class NewcomerWatch:
    """Whether a pod pass is due because a pod woke: the arbiter counts the pods that began to
    ask for a GPU's lease after a second or more without, and tells the bursting pods beside it
    to run at their hard limit until a pass has counted it in (their burst rates did not).
    Without a pass soon after, that lasted until the next periodic one, up to a second."""

    def __init__(self, broker: LeaseBroker, clock: Callable[[], float] = time.monotonic) -> None:
        self.broker = broker
        self.clock = clock
        self.count = broker.stats().newcomers
        self.seen_at: float | None = None

    def pass_due(self) -> bool:
        count = self.broker.stats().newcomers
        now = self.clock()
        if count != self.count:
            self.count = count
            self.seen_at = now if self.seen_at is None else self.seen_at
        if self.seen_at is not None and now - self.seen_at >= NEWCOMER_SETTLE_S:
            self.seen_at = None
            return True
        return False
