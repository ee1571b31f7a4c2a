"""Boost correction: every GPU's boost estimate (gpu/boost.py), published into its device lease
under the base path, where the compute limiter of every pod on the GPU reads it.

Readings are taken often (the energy counter moves in 100-ms steps on an H100, and the times of
its steps are what the power is measured from), three cheap NVML queries per GPU. A GPU whose
readings fail keeps its last estimate until it goes stale in the lease (5 s); on close the
estimates are withdrawn, so the limiter charges plain GPU time again at once.
"""

import logging
import time
from pathlib import Path

from vgpu_limiter.lease import DeviceLease
from vgpu_limiter.region import RegionError, normalize_uuid

from .gpu import NOT_AVAILABLE, nvml
from .gpu.boost import BoostEstimator

READ_INTERVAL_S = 0.025
"""Between two readings: the error of a step's time over a 1-s window, 2.5 %."""
LIMIT_EVERY_S = 5.0
"""The power limit changes rarely (an operator's nvidia-smi -pl): read it this often."""

log = logging.getLogger(__name__)


class _Gpu:
    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: nvml.Handle | None = None
        self.uuid: str | None = None
        self.lease: DeviceLease | None = None
        self.limit_mw: int | None = None
        self.limit_read = -LIMIT_EVERY_S
        self.estimator = BoostEstimator()
        self.published: float | None = None


def _known(value: object) -> int | None:
    return value if isinstance(value, int) else None


class BoostPublisher:
    """One caller ticks (the daemon's boost task); ``boosts`` may be read from any thread."""

    def __init__(self, base: Path, device_count: int) -> None:
        self._base = base
        self._gpus = [_Gpu(index) for index in range(device_count)]

    def boosts(self) -> dict[str, float]:
        """The latest estimate of each GPU that has one, by UUID."""
        return {
            gpu.uuid: gpu.estimator.boost
            for gpu in self._gpus
            if gpu.uuid is not None and gpu.estimator.boost is not None
        }

    def tick(self) -> None:
        """Read every GPU once and publish what changed (blocking: a few NVML calls each)."""
        now = time.monotonic()
        with nvml.LOCK:
            for gpu in self._gpus:
                self._read(gpu, now)
        for gpu in self._gpus:
            self._publish(gpu)

    def _read(self, gpu: _Gpu, now: float) -> None:
        if gpu.handle is None:
            handle = nvml.device_handle(gpu.index)
            uuid = nvml.device_uuid(handle) if handle is not NOT_AVAILABLE else NOT_AVAILABLE
            if handle is NOT_AVAILABLE or not isinstance(uuid, str):
                return
            gpu.handle, gpu.uuid = handle, uuid
        if now - gpu.limit_read >= LIMIT_EVERY_S:
            gpu.limit_mw = _known(nvml.device_power_limit(gpu.handle))
            gpu.limit_read = now
        rates = nvml.device_utilization(gpu.handle)
        busy = _known(rates[0]) if rates is not NOT_AVAILABLE else None
        energy = _known(nvml.device_energy(gpu.handle))
        gpu.estimator.add(now, energy, busy, gpu.limit_mw)

    def _publish(self, gpu: _Gpu) -> None:
        boost = gpu.estimator.boost
        if boost is None or gpu.uuid is None:
            return
        if gpu.lease is None:
            try:
                gpu.lease = DeviceLease.open(self._base, normalize_uuid(gpu.uuid))
            except (RegionError, ValueError) as error:
                log.warning("boost correction off for GPU %d: %s", gpu.index, error)
                gpu.uuid = None  # not again
                return
        gpu.lease.publish_boost(boost)  # also when unchanged: the time says the daemon lives
        if gpu.published is None or abs(boost - gpu.published) >= 0.05:
            log.info("GPU %d boost %.3f", gpu.index, boost)
            gpu.published = boost

    def close(self) -> None:
        """Withdraw every published estimate and unmap the leases."""
        for gpu in self._gpus:
            if gpu.lease is not None:
                gpu.lease.withdraw_boost()
                gpu.lease.close()
                gpu.lease = None
