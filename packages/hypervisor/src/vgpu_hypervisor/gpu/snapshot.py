"""Immutable snapshots of the node's GPUs, as one sampling pass saw them.

Every queried field may be NOT_AVAILABLE; ``to_dict()`` gives plain JSON values (None for it).
"""

import dataclasses
from typing import Any, Literal

from .values import NOT_AVAILABLE, Value

BackendKind = Literal["nvml", "simulated"]


def to_plain(value: object) -> Any:
    """A JSON-serialisable copy: dataclasses become dicts, tuples lists, NOT_AVAILABLE None."""
    if value is NOT_AVAILABLE:
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): to_plain(item) for key, item in value.items()}
    return value


class PlainData:
    """Adds ``to_dict()`` to a snapshot dataclass."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        plain: dict[str, Any] = to_plain(self)
        return plain


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessMemory(PlainData):
    """A compute process on a device: host pid (as NVML reports it) and device memory (bytes)."""

    pid: int
    used_memory: Value[int]


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessUtilization(PlainData):
    """A process's newest utilization sample on a device (percent), new since the last pass;
    ``timestamp_us`` is the driver's wall-clock time of the sample in microseconds."""

    pid: int
    timestamp_us: int
    sm_utilization: Value[int]
    memory_utilization: Value[int]
    encoder_utilization: Value[int]
    decoder_utilization: Value[int]


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceSnapshot(PlainData):
    """One GPU, with what the daemon shows or exports (one NVML query per field per pass, the
    name and UUID once). Units: memory in bytes, utilization in percent, temperature in °C,
    power in mW, clocks in MHz.

    ``processes``: compute processes with their memory; ``process_utilization``: processes that
    ran work since the previous pass (NVML lists only those), one newest sample each.
    ``energy_mj``: energy since the driver loaded, in mJ; ``xid_errors``: (XID code, count)
    of the XID errors seen since the observer opened, empty when none came, NOT_AVAILABLE
    where the driver gives no events. The fields after ``process_utilization`` default to
    NOT_AVAILABLE.
    """

    index: int
    uuid: Value[str]
    name: Value[str]
    memory_total: Value[int]
    memory_used: Value[int]
    gpu_utilization: Value[int]
    memory_utilization: Value[int]
    temperature_c: Value[int]
    power_draw_mw: Value[int]
    sm_clock_mhz: Value[int]
    processes: Value[tuple[ProcessMemory, ...]]
    process_utilization: Value[tuple[ProcessUtilization, ...]]
    pci_bus_id: Value[str] = NOT_AVAILABLE
    minor_number: Value[int] = NOT_AVAILABLE
    memory_free: Value[int] = NOT_AVAILABLE
    memory_clock_mhz: Value[int] = NOT_AVAILABLE
    energy_mj: Value[int] = NOT_AVAILABLE
    xid_errors: Value[tuple[tuple[int, int], ...]] = NOT_AVAILABLE


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSnapshot(PlainData):
    """All GPUs of the node from one pass: ``taken_at`` (Unix seconds) when it began,
    ``duration`` (seconds) how long it took."""

    backend: BackendKind
    taken_at: float
    duration: float
    devices: tuple[DeviceSnapshot, ...]

    def device(self, key: int | str) -> DeviceSnapshot | None:
        """The device with this index or UUID (case-insensitive), or None."""
        for device in self.devices:
            if isinstance(key, int):
                if device.index == key:
                    return device
            elif isinstance(device.uuid, str) and device.uuid.lower() == key.lower():
                return device
        return None
