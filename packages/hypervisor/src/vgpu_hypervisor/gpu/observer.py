"""Sampling every GPU of the node: one synchronous pass, or the same off the event loop."""

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType

from . import backend, nvml
from .backend import BackendInfo, GpuBackendError
from .device import DeviceReader
from .snapshot import NodeSnapshot


class GpuObserver:
    """The node's GPUs through NVML (real or simulated). Thread-safe: passes are serialized by
    ``nvml.LOCK``; ``sample_async`` runs a pass in a worker thread.

    ``with GpuObserver.open() as observer: observer.sample()``; log ``observer.backend.describe()``
    first, so the log says which GPU the daemon watches.
    """

    def __init__(self, info: BackendInfo) -> None:
        """Use ``open``: this takes over one NVML initialization that ``close`` shuts down."""
        self._info = info
        self._readers = [DeviceReader(index) for index in range(info.device_count)]
        self._closed = False

    @classmethod
    def open(
        cls,
        *,
        simulate: bool | None = None,
        sim_state: Path | None = None,
        library: Path | None = None,
    ) -> "GpuObserver":
        """Start NVML (see backend.start for the arguments); GpuBackendError when it cannot."""
        return cls(backend.start(simulate=simulate, sim_state=sim_state, library=library))

    @property
    def backend(self) -> BackendInfo:
        return self._info

    def sample(self) -> NodeSnapshot:
        """One pass over all devices (blocking; a few NVML calls per device). Never raises for
        what a driver cannot answer; GpuBackendError after close."""
        with nvml.LOCK:
            if self._closed:
                raise GpuBackendError("the GPU observer is closed")
            taken_at = time.time()
            started = time.perf_counter()
            devices = tuple(reader.read() for reader in self._readers)
            return NodeSnapshot(
                backend=self._info.backend,
                taken_at=taken_at,
                duration=time.perf_counter() - started,
                devices=devices,
            )

    async def sample_async(self) -> NodeSnapshot:
        """``sample`` in a worker thread, so the event loop never waits on the driver."""
        return await asyncio.to_thread(self.sample)

    async def watch(self, interval: float) -> AsyncIterator[NodeSnapshot]:
        """A snapshot every ``interval`` seconds (at a steady rate, a slow pass delays it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            yield await self.sample_async()
            deadline = max(deadline + interval, loop.time())
            await asyncio.sleep(deadline - loop.time())

    def close(self) -> None:
        """Shut NVML down; later calls do nothing."""
        with nvml.LOCK:
            if not self._closed:
                self._closed = True
                for reader in self._readers:
                    reader.close()
                backend.stop()

    def __enter__(self) -> "GpuObserver":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
