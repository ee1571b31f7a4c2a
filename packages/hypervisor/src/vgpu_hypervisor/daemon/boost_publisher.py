"""Boost correction: every GPU's boost estimate (gpu/boost_estimate.py), published into its
device lease under the base path, where the compute limiter of every pod on the GPU reads it.

Only GPUs with paced work (their lease active in the last few seconds) are read often: the
energy counter every 50 ms (it moves in 100-ms steps on an H100, and the times of its steps are
what the power is measured from), utilization every 200 ms (NVML averages it over 1/6 s or
more itself). A GPU without paced work is left alone and its estimate kept. A GPU with paced
work whose readings keep failing for FAILING_S has its estimate withdrawn until they come back:
an estimate nothing checks may no longer fit the load (before, 1.108 was published through
10 s of failing energy readings at 100 % utilization, where the GPU's boost was 1). On close
the estimates are withdrawn, so the limiter charges plain GPU time again at once.
"""

import logging
import time
from pathlib import Path

from vgpu_common.limits import normalize_uuid
from vgpu_limiter.lease import DeviceLease
from vgpu_limiter.lease_broker import LeaseBroker
from vgpu_limiter.region import RegionError

from vgpu_hypervisor.gpu import NOT_AVAILABLE, nvml
from vgpu_hypervisor.gpu.boost_estimate import BoostEstimator

READ_INTERVAL_S = 0.05
"""Between two energy readings: the time of a counter step is known to this much."""
UTILIZATION_EVERY_S = 0.2
LIMIT_EVERY_S = 5.0
"""The power limit changes rarely (an operator's nvidia-smi -pl): read it this often."""
PACED_RECENTLY_S = 5.0
"""A GPU whose lease saw a limited process this recently is read."""
FAILING_S = 2.0
"""A paced GPU's estimate is withdrawn once its readings have failed this long: two windows."""

log = logging.getLogger(__name__)


class _Gpu:
    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: nvml.Handle | None = None
        self.uuid: str | None = None
        self.lease: DeviceLease | None = None
        self.from_lease_file = False  # opened here (a lease file), not the arbiter's lease
        self.limit_mw: int | None = None
        self.limit_read = -LIMIT_EVERY_S
        self.utilization: int | None = None
        self.utilization_read = -UTILIZATION_EVERY_S
        self.estimator = BoostEstimator()
        self.published: float | None = None
        self.failing_since: float | None = None  # paced, and readings failing since then
        self.withdrawn = False


def _known(value: object) -> int | None:
    return value if isinstance(value, int) else None


class BoostPublisher:
    """One caller ticks (the daemon's boost task); ``boosts`` may be read from any thread."""

    def __init__(self, base: Path, device_count: int, leases: LeaseBroker | None = None) -> None:
        """``leases``: the daemon's lease arbiter, whose lease words (and node files) are used for
        the GPUs they cover; the others' lease files are opened here."""
        self._base = base
        self._gpus = [_Gpu(index) for index in range(device_count)]
        self._leases = leases

    def boosts(self) -> dict[str, float]:
        """The latest estimate of each GPU that has one published, by UUID."""
        return {
            gpu.uuid: gpu.estimator.boost
            for gpu in self._gpus
            if gpu.uuid is not None and gpu.estimator.boost is not None and not gpu.withdrawn
        }

    def tick(self) -> None:
        """Read every GPU with paced work once and publish (blocking: a few NVML calls each)."""
        now = time.monotonic()
        with nvml.LOCK:
            for gpu in self._gpus:
                if self._connect(gpu) and self._paced(gpu):
                    self._read(gpu, now)
                else:
                    gpu.failing_since = None  # not read: nothing failed (its estimate is kept)
        for gpu in self._gpus:
            self._publish(gpu, now)

    def _connect(self, gpu: _Gpu) -> bool:
        """The GPU's handle, UUID and lease, found once; False while they cannot be had."""
        if gpu.lease is not None:
            return True
        if gpu.handle is None:
            handle = nvml.device_handle(gpu.index)
            uuid = nvml.device_uuid(handle) if handle is not NOT_AVAILABLE else NOT_AVAILABLE
            if handle is NOT_AVAILABLE or not isinstance(uuid, str):
                return False
            gpu.handle, gpu.uuid = handle, uuid
        if gpu.uuid is None:
            return False  # its lease could not be made: given up
        sealed = self._leases.device_lease(gpu.uuid) if self._leases is not None else None
        if sealed is not None:
            gpu.lease = sealed
            return True
        try:
            gpu.lease = DeviceLease.open(self._base, normalize_uuid(gpu.uuid))
            gpu.from_lease_file = True
        except (RegionError, ValueError) as error:
            log.warning("boost correction off for GPU %d: %s", gpu.index, error)
            gpu.uuid = None
            return False
        return True

    @staticmethod
    def _paced(gpu: _Gpu) -> bool:
        assert gpu.lease is not None
        return gpu.lease.active_within(PACED_RECENTLY_S)

    def _read(self, gpu: _Gpu, now: float) -> None:
        assert gpu.handle is not None
        if now - gpu.limit_read >= LIMIT_EVERY_S:
            gpu.limit_mw = _known(nvml.device_power_limit(gpu.handle))
            gpu.limit_read = now
        if now - gpu.utilization_read >= UTILIZATION_EVERY_S:
            rates = nvml.device_utilization(gpu.handle)
            gpu.utilization = _known(rates[0]) if rates is not NOT_AVAILABLE else None
            gpu.utilization_read = now
        energy = _known(nvml.device_energy(gpu.handle))
        assert gpu.lease is not None
        paced_busy_ns = gpu.lease.busy_ns()
        # The activity of a lease the daemon arbitrates is its own word; a lease file's is a
        # tenant's, which must not keep an old estimate in place (it bounds nothing).
        paced_at = None if gpu.from_lease_file else gpu.lease.last_active()
        if energy is None or gpu.utilization is None or not gpu.limit_mw:
            gpu.failing_since = now if gpu.failing_since is None else gpu.failing_since
        else:
            gpu.failing_since = None
        boost = gpu.estimator.add(
            now,
            energy,
            gpu.utilization,
            gpu.limit_mw,
            paced_busy_ns=paced_busy_ns,
            paced_at=paced_at,
        )
        # Every reading at debug level: what the model is fitted and checked against.
        log.debug(
            "boost reading: GPU %d at %.3f s: energy %s mJ, utilization %s %%, limit %s mW, "
            "paced %s ns, paced at %s s; boost %s",
            gpu.index,
            now,
            energy,
            gpu.utilization,
            gpu.limit_mw,
            paced_busy_ns,
            "unknown" if paced_at is None else f"{paced_at:.3f}",
            "none" if boost is None else f"{boost:.4f}",
        )

    def _publish(self, gpu: _Gpu, now: float) -> None:
        boost = gpu.estimator.boost
        if boost is None or gpu.lease is None:
            return
        if gpu.failing_since is not None and now - gpu.failing_since >= FAILING_S:
            if not gpu.withdrawn:
                log.warning(
                    "GPU %d: its power or utilization readings failed for %.0f s: boost "
                    "correction withdrawn until they come back",
                    gpu.index,
                    now - gpu.failing_since,
                )
                gpu.lease.withdraw_boost()
                gpu.withdrawn, gpu.published = True, None
            return
        if gpu.withdrawn:
            log.info("GPU %d: its readings came back: boost correction again", gpu.index)
            gpu.withdrawn = False
        gpu.lease.publish_boost(boost)  # also when unchanged: the time says the daemon lives
        if gpu.published is None or abs(boost - gpu.published) >= 0.05:
            log.info("GPU %d boost %.3f", gpu.index, boost)
            gpu.published = boost

    def close(self) -> None:
        """Withdraw every published estimate and unmap the leases."""
        for gpu in self._gpus:
            if gpu.lease is not None:
                gpu.lease.withdraw_boost()
                if gpu.from_lease_file:
                    gpu.lease.close()  # the broker closes its leases itself
                gpu.lease = None
