"""The typed, tolerant boundary over pynvml (which has no type hints: ``Any`` stays in here).

Queries return their value or NOT_AVAILABLE: an NVML error of any kind (not supported, no
permission, GPU lost, function missing from an older driver...) and any unexpected failure of
pynvml is "not available", logged once per query and cause, never raised. Only the library's
lifetime (load, initialize) raises. Callers hold ``LOCK`` around NVML calls.
"""

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NewType, TypeVar

import pynvml  # type: ignore[import-untyped]

from .snapshot import ProcessMemory, ProcessUtilization
from .values import NOT_AVAILABLE, Value

T = TypeVar("T")

Handle = NewType("Handle", object)
"""An NVML device handle (opaque)."""

EventSet = NewType("EventSet", object)
"""An NVML event set (opaque); freed with ``free_events``."""

LOCK = threading.RLock()
"""Serializes this package's NVML calls and the choice of library."""

SONAME = "libnvidia-ml.so.1"

NVMLError: type[Exception] = pynvml.NVMLError
LIBRARY_NOT_FOUND: int = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
DRIVER_NOT_LOADED: int = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
_FUNCTION_NOT_FOUND: int = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
_NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
_SUCCESS: int = pynvml.NVML_SUCCESS
_TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
_XID_EVENT: int = pynvml.nvmlEventTypeXidCriticalError
# A pass drains at most this many events per device: a GPU flooding XIDs must not stall it.
_MAX_EVENTS = 64
# NVML's "no value" markers in unsigned fields (NVML_VALUE_NOT_AVAILABLE).
_NO_VALUE = frozenset({0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})

_log = logging.getLogger(__name__)
_reported: set[tuple[str, str]] = set()


def error_code(error: BaseException) -> int | None:
    """The NVML return code an NVMLError carries."""
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def _unsupported(error: BaseException) -> bool:
    """True for "this query does not exist here": try an older variant of it."""
    return (
        isinstance(error, AttributeError | pynvml.NVMLLibraryMismatchError)
        or error_code(error) == _FUNCTION_NOT_FOUND
    )


def _note(query: str, error: BaseException) -> None:
    key = (query, type(error).__name__)
    if key in _reported:
        return
    _reported.add(key)
    if isinstance(error, NVMLError):
        _log.debug("%s: not available (%s)", query, error)
    else:
        _log.warning("%s: not available (unexpected %s: %s)", query, type(error).__name__, error)


def query(name: str, *fetches: Callable[[], T]) -> Value[T]:
    """The first of ``fetches`` (variants of one query, newest first) the driver answers;
    NOT_AVAILABLE when none does. A sampling pass never raises out of here."""
    for position, fetch in enumerate(fetches, start=1):
        try:
            return fetch()
        except Exception as error:  # an unsupported query is "not available", never a crash
            if position == len(fetches) or not _unsupported(error):
                _note(name, error)
                return NOT_AVAILABLE
    return NOT_AVAILABLE


# --- the library ---------------------------------------------------------------------------


class _DlInfo(ctypes.Structure):
    _fields_ = (
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    )


def _file_of(library: ctypes.CDLL) -> Path | None:
    """The file a loaded library was mapped from (dladdr of one of its functions)."""
    for scope in (None, "libdl.so.2"):  # dladdr is in libc since glibc 2.34, libdl before
        try:
            dladdr = ctypes.CDLL(scope).dladdr
            function = library.nvmlInit_v2
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))
        dladdr.restype = ctypes.c_int
        info = _DlInfo()
        if dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return Path(os.fsdecode(info.dli_fname)).resolve()
    name = getattr(library, "_name", None)
    return Path(name).resolve() if isinstance(name, str) and "/" in name else None


def nvml_users() -> int:
    """How many nvmlInit calls through pynvml are not shut down yet, in this process."""
    count = getattr(pynvml, "_nvmlLib_refcount", 0)
    return count if isinstance(count, int) else 0


def loaded_library() -> Path | None:
    """The file of the libnvidia-ml pynvml uses, or None before one is loaded."""
    library = pynvml.nvmlLib
    return _file_of(library) if isinstance(library, ctypes.CDLL) else None


def load_library(name: str) -> Path:
    """Make pynvml use the library ``name`` (a path, or the soname searched as the dynamic
    linker does) from the next initialize; its file. Only while no pynvml user is left.

    Raises OSError when it cannot be loaded."""
    if nvml_users():
        raise RuntimeError("NVML is in use in this process: its library cannot change")
    library = ctypes.CDLL(name)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        # pynvml caches function pointers of the library it loaded first.
        cache = getattr(pynvml, "_nvmlGetFunctionPointer_cache", None)
        if isinstance(cache, dict):
            cache.clear()
    found = _file_of(library)
    return found if found is not None else Path(name)


def initialize() -> None:
    """nvmlInit through pynvml (loading libnvidia-ml.so.1 when none is loaded). Raises NVMLError."""
    pynvml.nvmlInit()


def shutdown() -> None:
    """nvmlShutdown; an error is logged, not raised."""
    try:
        pynvml.nvmlShutdown()
    except Exception as error:  # shutting down a lost GPU must not break the daemon's exit
        _log.warning("nvmlShutdown: %s", error)


def device_count() -> int:
    """How many devices the driver has. Raises NVMLError."""
    count = pynvml.nvmlDeviceGetCount()
    return int(count)


# --- typed queries -------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _number(value: Any) -> Value[int]:
    """An unsigned NVML figure; None or NVML's "no value" marker is NOT_AVAILABLE."""
    if value is None or int(value) in _NO_VALUE:
        return NOT_AVAILABLE
    return int(value)


def driver_version() -> Value[str]:
    return query("nvmlSystemGetDriverVersion", lambda: _text(pynvml.nvmlSystemGetDriverVersion()))


def nvml_version() -> Value[str]:
    return query("nvmlSystemGetNVMLVersion", lambda: _text(pynvml.nvmlSystemGetNVMLVersion()))


def cuda_version() -> Value[str]:
    """The CUDA version the driver supports, as "13.0"."""

    def fetch() -> str:
        version = int(pynvml.nvmlSystemGetCudaDriverVersion())
        return f"{version // 1000}.{version % 1000 // 10}"

    return query("nvmlSystemGetCudaDriverVersion", fetch)


def device_handle(index: int) -> Value[Handle]:
    return query(
        "nvmlDeviceGetHandleByIndex", lambda: Handle(pynvml.nvmlDeviceGetHandleByIndex(index))
    )


def device_minor(handle: Handle) -> Value[int]:
    """The N of the GPU's /dev/nvidiaN."""
    return query("nvmlDeviceGetMinorNumber", lambda: int(pynvml.nvmlDeviceGetMinorNumber(handle)))


def device_compute_capability(handle: Handle) -> Value[str]:
    """CUDA's compute capability, as "9.0"."""

    def fetch() -> str:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return f"{int(major)}.{int(minor)}"

    return query("nvmlDeviceGetCudaComputeCapability", fetch)


def device_architecture(handle: Handle) -> Value[int]:
    """nvmlDeviceArchitecture_t (NVML_DEVICE_ARCH_*)."""
    return query("nvmlDeviceGetArchitecture", lambda: int(pynvml.nvmlDeviceGetArchitecture(handle)))


def device_name(handle: Handle) -> Value[str]:
    return query("nvmlDeviceGetName", lambda: _text(pynvml.nvmlDeviceGetName(handle)))


def device_uuid(handle: Handle) -> Value[str]:
    return query("nvmlDeviceGetUUID", lambda: _text(pynvml.nvmlDeviceGetUUID(handle)))


def device_pci_bus_id(handle: Handle) -> Value[str]:
    """The PCI address as nvidia-smi and dcgm-exporter show it ("00000000:1B:00.0")."""
    return query("nvmlDeviceGetPciInfo", lambda: _text(pynvml.nvmlDeviceGetPciInfo(handle).busId))


def device_minor_number(handle: Handle) -> Value[int]:
    """N of the device's /dev/nvidiaN."""
    return _figure("nvmlDeviceGetMinorNumber", lambda: pynvml.nvmlDeviceGetMinorNumber(handle))


def device_memory(handle: Handle) -> Value[tuple[Value[int], Value[int], Value[int]]]:
    """(total, used, free) in bytes; used without the driver's reserve where the v2 query
    exists (so used + free may be less than total: the reserve is neither)."""

    def v2() -> tuple[Value[int], Value[int], Value[int]]:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        return _number(info.total), _number(info.used), _number(info.free)

    def v1() -> tuple[Value[int], Value[int], Value[int]]:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return _number(info.total), _number(info.used), _number(info.free)

    return query("nvmlDeviceGetMemoryInfo", v2, v1)


def device_utilization(handle: Handle) -> Value[tuple[Value[int], Value[int]]]:
    """(gpu, memory) utilization in percent."""

    def fetch() -> tuple[Value[int], Value[int]]:
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        return _number(rates.gpu), _number(rates.memory)

    return query("nvmlDeviceGetUtilizationRates", fetch)


def _figure(name: str, fetch: Callable[[], Any]) -> Value[int]:
    return query(name, lambda: _number(fetch()))


def device_temperature(handle: Handle) -> Value[int]:
    return _figure(
        "nvmlDeviceGetTemperature",
        lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
    )


def device_power_draw(handle: Handle) -> Value[int]:
    return _figure("nvmlDeviceGetPowerUsage", lambda: pynvml.nvmlDeviceGetPowerUsage(handle))


def device_power_limit(handle: Handle) -> Value[int]:
    return _figure(
        "nvmlDeviceGetEnforcedPowerLimit", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)
    )


def device_energy(handle: Handle) -> Value[int]:
    return _figure(
        "nvmlDeviceGetTotalEnergyConsumption",
        lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
    )


def device_sm_clock(handle: Handle) -> Value[int]:
    return _figure(
        "nvmlDeviceGetClockInfo",
        lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
    )


def device_memory_clock(handle: Handle) -> Value[int]:
    return _figure(
        "nvmlDeviceGetClockInfo(MEM)",
        lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
    )


def xid_events(handle: Handle) -> Value[EventSet]:
    """An event set that receives the device's XID errors (critical driver events), or
    NOT_AVAILABLE where the driver has no events (the simulated GPU, some virtual GPUs)."""

    def fetch() -> EventSet:
        event_set = pynvml.nvmlEventSetCreate()
        try:
            pynvml.nvmlDeviceRegisterEvents(handle, _XID_EVENT, event_set)
        except BaseException:
            pynvml.nvmlEventSetFree(event_set)
            raise
        return EventSet(event_set)

    return query("nvmlDeviceRegisterEvents(XID)", fetch)


def pending_xids(event_set: EventSet) -> Value[tuple[int, ...]]:
    """The XID codes that arrived since the last call, oldest first; never waits."""

    def fetch() -> tuple[int, ...]:
        codes: list[int] = []
        for _ in range(_MAX_EVENTS):
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, 0)
            except NVMLError as error:
                if error_code(error) == _TIMEOUT:  # nothing (more) pending
                    break
                raise
            if int(data.eventType) & _XID_EVENT:
                codes.append(int(data.eventData))
        return tuple(codes)

    return query("nvmlEventSetWait", fetch)


def free_events(event_set: EventSet) -> None:
    """nvmlEventSetFree; an error is logged, not raised."""
    query("nvmlEventSetFree", lambda: pynvml.nvmlEventSetFree(event_set))


def device_processes(handle: Handle) -> Value[tuple[ProcessMemory, ...]]:
    """Compute processes with their device memory (newest query variant the driver has)."""

    def listing(function: str) -> Callable[[], tuple[ProcessMemory, ...]]:
        def fetch() -> tuple[ProcessMemory, ...]:
            return tuple(
                ProcessMemory(pid=int(p.pid), used_memory=_number(p.usedGpuMemory))
                for p in getattr(pynvml, function)(handle)
            )

        return fetch

    return query(
        "nvmlDeviceGetComputeRunningProcesses",
        listing("nvmlDeviceGetComputeRunningProcesses_v3"),
        listing("nvmlDeviceGetComputeRunningProcesses_v2"),
    )


def device_process_utilization(
    handle: Handle, last_seen_us: int
) -> Value[tuple[ProcessUtilization, ...]]:
    """Utilization samples newer than ``last_seen_us`` (wall-clock microseconds), the newest
    per process; empty when no process ran work since (NVML's NOT_FOUND)."""

    def fetch() -> tuple[ProcessUtilization, ...]:
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us)
        except NVMLError as error:
            if error_code(error) in (_NOT_FOUND, _SUCCESS):  # pynvml raises on 0 samples too
                return ()
            raise
        newest: dict[int, ProcessUtilization] = {}
        for sample in samples:
            pid, stamp = int(sample.pid), int(sample.timeStamp)
            if stamp <= last_seen_us or (pid in newest and newest[pid].timestamp_us >= stamp):
                continue
            newest[pid] = ProcessUtilization(
                pid=pid,
                timestamp_us=stamp,
                sm_utilization=_number(sample.smUtil),
                memory_utilization=_number(sample.memUtil),
                encoder_utilization=_number(sample.encUtil),
                decoder_utilization=_number(sample.decUtil),
            )
        return tuple(newest.values())

    return query("nvmlDeviceGetProcessUtilization", fetch)
