"""The daemon's view of the node's GPUs through NVML: tolerant (a query the driver cannot answer
is NOT_AVAILABLE, never an error), off the event loop, on the NVIDIA driver or the simulated GPU.

    with GpuObserver.open() as observer:
        log.info(observer.backend.describe())
        snapshot = await observer.sample_async()
"""

from .backend import BackendInfo, GpuBackendError
from .observer import GpuObserver
from .snapshot import (
    BackendKind,
    DeviceSnapshot,
    NodeSnapshot,
    ProcessMemory,
    ProcessUtilization,
)
from .values import NOT_AVAILABLE, NotAvailable, Value, or_default

__all__ = [
    "NOT_AVAILABLE",
    "BackendInfo",
    "BackendKind",
    "DeviceSnapshot",
    "GpuBackendError",
    "GpuObserver",
    "NodeSnapshot",
    "NotAvailable",
    "ProcessMemory",
    "ProcessUtilization",
    "Value",
    "or_default",
]
