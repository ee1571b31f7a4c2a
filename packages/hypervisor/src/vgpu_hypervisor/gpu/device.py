"""Reading one GPU into a DeviceSnapshot, query by query, each one allowed to fail."""

import time
from collections import Counter

from . import nvml
from .snapshot import DeviceSnapshot
from .values import NOT_AVAILABLE, Value

_WINDOW_US = 1_000_000  # the first pass asks for the last second of process samples


class DeviceReader:
    """One device: its handle and fixed facts (read once), and the process-utilization cursor
    (the newest sample time seen, passed back as NVML's lastSeenTimeStamp so each sample is
    reported once). Not thread-safe: callers serialize passes and hold nvml.LOCK."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._handle: Value[nvml.Handle] = NOT_AVAILABLE
        self._uuid: Value[str] = NOT_AVAILABLE
        self._name: Value[str] = NOT_AVAILABLE
        self._pci_bus_id: Value[str] = NOT_AVAILABLE
        self._minor: Value[int] = NOT_AVAILABLE
        self._xid_events: Value[nvml.EventSet] = NOT_AVAILABLE
        self._xids: Counter[int] = Counter()
        self._last_seen_us = time.time_ns() // 1000 - _WINDOW_US

    def _connect(self) -> Value[nvml.Handle]:
        """The handle; a device that gave none is asked again on the next pass."""
        if self._handle is NOT_AVAILABLE:
            handle = nvml.device_handle(self.index)
            if handle is not NOT_AVAILABLE:
                self._handle = handle
                self._uuid = nvml.device_uuid(handle)
                self._name = nvml.device_name(handle)
                self._pci_bus_id = nvml.device_pci_bus_id(handle)
                self._minor = nvml.device_minor_number(handle)
                self._xid_events = nvml.xid_events(handle)
        return self._handle

    def _read_xids(self) -> Value[tuple[tuple[int, int], ...]]:
        """The XID counts so far (each pass adds the events that arrived since the last)."""
        if self._xid_events is NOT_AVAILABLE:
            return NOT_AVAILABLE
        codes = nvml.pending_xids(self._xid_events)
        if codes is NOT_AVAILABLE:
            return NOT_AVAILABLE
        self._xids.update(codes)
        return tuple(sorted(self._xids.items()))

    def close(self) -> None:
        """Free the device's event set (before NVML shuts down)."""
        if self._xid_events is not NOT_AVAILABLE:
            nvml.free_events(self._xid_events)
            self._xid_events = NOT_AVAILABLE

    def read(self) -> DeviceSnapshot:
        """One pass over the device; never raises."""
        handle = self._connect()
        if handle is NOT_AVAILABLE:
            return self._unreachable()
        memory = nvml.device_memory(handle)
        total, used, free = (NOT_AVAILABLE,) * 3 if memory is NOT_AVAILABLE else memory
        rates = nvml.device_utilization(handle)
        gpu, memory_rate = (NOT_AVAILABLE,) * 2 if rates is NOT_AVAILABLE else rates
        samples = nvml.device_process_utilization(handle, self._last_seen_us)
        if samples is not NOT_AVAILABLE and samples:
            self._last_seen_us = max(sample.timestamp_us for sample in samples)
        return DeviceSnapshot(
            index=self.index,
            uuid=self._uuid,
            name=self._name,
            memory_total=total,
            memory_used=used,
            gpu_utilization=gpu,
            memory_utilization=memory_rate,
            temperature_c=nvml.device_temperature(handle),
            power_draw_mw=nvml.device_power_draw(handle),
            sm_clock_mhz=nvml.device_sm_clock(handle),
            processes=nvml.device_processes(handle),
            process_utilization=samples,
            pci_bus_id=self._pci_bus_id,
            minor_number=self._minor,
            memory_free=free,
            memory_clock_mhz=nvml.device_memory_clock(handle),
            energy_mj=nvml.device_energy(handle),
            xid_errors=self._read_xids(),
        )

    def _unreachable(self) -> DeviceSnapshot:
        na = NOT_AVAILABLE
        return DeviceSnapshot(
            index=self.index,
            uuid=na,
            name=na,
            memory_total=na,
            memory_used=na,
            gpu_utilization=na,
            memory_utilization=na,
            temperature_c=na,
            power_draw_mw=na,
            sm_clock_mhz=na,
            processes=na,
            process_utilization=na,
        )
