"""The pod region from Python: create, open, read and change it as vgpu_region.h describes.

The protocol exists once, in C: libvgpu_region.so (the region code of libcuda_limiter.so, built
alone so that the daemon never loads the interposer) creates and opens region files, adds
devices, stores and reads limits through the seqlock, records host pids and reclaims the slots
of dead processes. The build preprocesses its header, vgpu_region_api.h, into
``region_cdef.h``, whose declarations go to cffi (ABI mode, no compiler at run time) and whose
``#define VGPU_*`` lines give the constants: nothing here restates a size, a prototype or a value.

What stays here is a typed layer (snapshots as dataclasses, failures as :class:`RegionError`)
and pure reads: the header fields and the process table are read with ``pread`` into a private
buffer, and every access to the shared mapping goes through the library, which catches a file
truncated under it. So a tenant who truncates its pod's file costs the daemon an error for that
pod, never a SIGBUS.

Writers (limits, device entries, host pids, generations) hold ``flock(LOCK_EX)`` on the region
file, the lock the limiter takes for the same changes; the kernel drops it if its holder dies.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from cffi import FFI
from vgpu_common.limits import (
    MAX_WEIGHT,
    NO_LIMITS,
    GpuLimits,
    Qos,
    hundredths_to_percent,
    normalize_uuid,
)

_HERE = Path(__file__).resolve().parent
CDEF_PATH: Final = _HERE / "region_cdef.h"
LIBRARY_PATH: Final = _HERE / "libvgpu_region.so"

DEFAULT_NAMESPACE: Final = "default"
REGION_FILE: Final = "shm"

_DEFINE = re.compile(
    r"#define\s+(VGPU_\w+)\s+\(?\s*(-?)(0[xX][0-9a-fA-F]+|0[0-7]+|\d+)[uUlL]*\s*\)?\s*", re.ASCII
)


class RegionError(Exception):
    """A region file that cannot be used; the message is one line naming the file."""


WRITERS_LOCK_WAIT_S: Final = 0.1
"""How long a writer waits for the writers' lock (the limiter holds it for microseconds)."""
WRITERS_LOCK_SHUNNED_S: Final = 1.0
"""After a wait that ran out, how long the next writers try once and do not wait: a pod whose
process keeps the lock costs the daemon at most a tenth of its time, however many changes
(a host pid for each of many slots, say) a pass makes there."""


def _take_writers_lock(fd: int, path: Path, wait_s: float) -> None:
    """flock(LOCK_EX) on ``fd``, tried for ``wait_s``; RegionError then."""
    deadline = time.monotonic() + wait_s
    pause = 0.0005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now >= deadline:
            raise RegionError(
                f"{path}: the writers' lock is held by another process (a process of the pod "
                f"kept it for over {WRITERS_LOCK_WAIT_S:g} s)"
            )
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 2, 0.02)


def _read_cdef(path: Path) -> tuple[str, dict[str, int]]:
    """The struct text for cffi and the integer VGPU_* constants of the preprocessed header."""
    try:
        text = path.read_text()
    except OSError as error:
        raise RuntimeError(
            f"{path}: {error.strerror}: the vgpu-limiter build did not produce it"
        ) from None
    constants: dict[str, int] = {}
    declarations = []
    for line in text.splitlines():
        if line.startswith("#"):
            match = _DEFINE.fullmatch(line.strip())
            if match and match[1] != "VGPU_REGION_CDEF":  # the build's switch, not the layout's
                digits = match[3]
                octal = len(digits) > 1 and digits[0] == "0" and digits[1] not in "xX"
                value = int(digits, 8) if octal else int(digits, 0)
                constants[match[1]] = -value if match[2] else value
        else:
            declarations.append(line)
    return "\n".join(declarations), constants


def _build_ffi() -> tuple[FFI, dict[str, int]]:
    declarations, constants = _read_cdef(CDEF_PATH)
    ffi = FFI()
    ffi.cdef(declarations)
    return ffi, constants


ffi, CONSTANTS = _build_ffi()


def _constant(name: str) -> int:
    try:
        return CONSTANTS[name]
    except KeyError:
        raise RuntimeError(f"{CDEF_PATH}: no #define {name}") from None


MAGIC: Final = _constant("VGPU_REGION_MAGIC")
VERSION: Final = _constant("VGPU_REGION_VERSION")
MAX_DEVICES: Final = _constant("VGPU_REGION_MAX_DEVICES")
MAX_PROCESSES: Final = _constant("VGPU_REGION_MAX_PROCESSES")
UUID_SIZE: Final = _constant("VGPU_REGION_UUID_SIZE")
NAME_SIZE: Final = _constant("VGPU_REGION_NAME_SIZE")
SLOT_FREE: Final = _constant("VGPU_SLOT_FREE")
SLOT_CLAIMING: Final = _constant("VGPU_SLOT_CLAIMING")
SLOT_RECLAIMING: Final = _constant("VGPU_SLOT_RECLAIMING")
COMPUTE_UNLIMITED: Final = _constant("VGPU_COMPUTE_UNLIMITED")
FLAG_FROZEN: Final = _constant("VGPU_REGION_FROZEN")
DEVICE_OVERSUBSCRIBE: Final = _constant("VGPU_DEVICE_OVERSUBSCRIBE")
DEVICE_FLAGS: Final = DEVICE_OVERSUBSCRIBE  # every known device flag
FLAG_DELETED: Final = _constant("VGPU_REGION_DELETED")
_ERROR: Final = _constant("VGPU_REGION_ERROR")
_EXISTS: Final = _constant("VGPU_REGION_EXISTS")
_FULL: Final = _constant("VGPU_REGION_FULL")
_FAULT: Final = _constant("VGPU_REGION_FAULT")
_OWNER_KEEP: Final = _constant("VGPU_OWNER_KEEP")
REGION_SIZE: Final = ffi.sizeof("struct vgpu_region")
REGION_ROOM: Final = (REGION_SIZE + (2 << 20) - 1) & ~((2 << 20) - 1)
"""The space a region file may hold: its size in whole 2-MiB pages (a tmpfs mounted with
``huge=always`` gives a file whole huge pages)."""
HEADER_SIZE: Final = ffi.offsetof("struct vgpu_region", "devices")
_PROCESS_OFFSET: Final = ffi.offsetof("struct vgpu_region", "processes")
_PROCESS_STRIDE: Final = ffi.sizeof("struct vgpu_region_process")
_PROCESS_BYTES: Final = _PROCESS_STRIDE * MAX_PROCESSES
_PID_INDEX: Final = ffi.offsetof("struct vgpu_region_process", "pid") // 4
assert _PROCESS_OFFSET % 4 == 0 and _PROCESS_STRIDE % 4 == 0 and ffi.sizeof("int32_t") == 4

_U64: Final = (1 << 64) - 1
# The pid namespace of the node (PROC_PID_INIT_INO): there, host pids are this kernel's pids.
INIT_PID_NAMESPACE: Final = 0xEFFFFFFC
_ERROR_SIZE: Final = 512

# Kubernetes names (DNS-1123) fit; "." and ".." and hidden or option-like names do not.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}", re.ASCII)


# Names and paths


def check_name(kind: str, value: str) -> str:
    """``value`` if it is a safe pod namespace or name (one path component), else ValueError."""
    if not _NAME.fullmatch(value):
        raise ValueError(
            f"bad {kind} {value!r}: use 1-253 letters, digits, '.', '_' and '-', "
            "starting with a letter, digit or '_'"
        )
    return value


def region_path(base: str | os.PathLike[str], namespace: str, pod: str) -> Path:
    """The region file of a pod: ``{base}/{namespace}/{pod}/shm``."""
    return (
        Path(base) / check_name("pod namespace", namespace) / check_name("pod name", pod)
    ) / REGION_FILE


def _check_limits(memory_limit: int | None, compute_limit: int | None) -> None:
    if memory_limit is not None and not 0 <= memory_limit <= _U64:
        raise ValueError(f"bad memory limit {memory_limit}: bytes from 0 (no limit) to 2**64-1")
    if compute_limit is not None and not 0 <= compute_limit <= COMPUTE_UNLIMITED:
        raise ValueError(
            f"bad compute limit {compute_limit}: hundredths of a percent from 0 to "
            f"{COMPUTE_UNLIMITED} (both mean no limit)"
        )


def _check_soft_limit(compute_limit: int, compute_soft_limit: int) -> None:
    if not 0 <= compute_soft_limit <= COMPUTE_UNLIMITED:
        raise ValueError(
            f"bad compute soft limit {compute_soft_limit}: hundredths of a percent from 0 "
            f"(no burst) to {COMPUTE_UNLIMITED}"
        )
    if compute_soft_limit and compute_limit and compute_soft_limit < compute_limit:
        raise ValueError(
            f"compute soft limit {compute_soft_limit} is below the compute limit "
            f"{compute_limit}: a burst limit is at least the hard limit"
        )


def _check_flags(device_flags: int) -> None:
    if device_flags & ~DEVICE_FLAGS:
        raise ValueError(f"unknown device flags {device_flags:#x}")


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    """What a pod may use of one GPU: the limits written together under the seqlock."""

    memory_limit: int = 0  # bytes; 0 = no memory limit
    compute_limit: int = 0  # hundredths of a percent; 0 or COMPUTE_UNLIMITED = none
    compute_soft_limit: int = 0  # burst limit in hundredths; 0 = no burst
    device_flags: int = 0  # DEVICE_* bits

    def check(self) -> None:
        _check_limits(self.memory_limit, self.compute_limit)
        _check_soft_limit(self.compute_limit, self.compute_soft_limit)
        _check_flags(self.device_flags)

    def fill(self, entry: Any) -> None:
        """Write these into a ``struct vgpu_region_limits``."""
        entry.memory_limit = self.memory_limit
        entry.compute_limit = self.compute_limit
        entry.compute_soft_limit = self.compute_soft_limit
        entry.device_flags = self.device_flags

    # The boundary between a GPU's limits as a value (vgpu_common.limits: None for no limit)
    # and the words the region keeps (0 for none): crossed here, and nowhere else.

    @classmethod
    def of(cls, limits: GpuLimits) -> DeviceLimits:
        """The words of a GPU's complete limits (none UNCHANGED: merged with ``over``)."""
        memory, compute, burst, oversubscribe = (
            limits.memory,
            limits.compute,
            limits.burst,
            limits.oversubscribe,
        )
        if not (
            isinstance(memory, int | None)
            and isinstance(compute, int | None)
            and isinstance(burst, int | None)
            and isinstance(oversubscribe, bool)
        ):
            raise ValueError(f"limits with a field unchanged are no words to store: {limits}")
        return cls(
            memory or 0,
            compute or 0,
            burst or 0,
            DEVICE_OVERSUBSCRIBE if oversubscribe else 0,
        )

    @property
    def value(self) -> GpuLimits:
        """These words as a GPU's limits; ValueError for words no limits have (a tenant can
        write its region)."""
        self.check()
        compute = self.compute_limit if self.compute_limit != COMPUTE_UNLIMITED else 0
        return GpuLimits(
            self.memory_limit or None,
            compute or None,
            (self.compute_soft_limit or None) if compute else None,
            bool(self.device_flags & DEVICE_OVERSUBSCRIBE),
        )


# Snapshots


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One device entry as read at one moment (limits read consistently)."""

    index: int
    uuid: str
    memory_limit: int  # bytes; 0 = no memory limit
    memory_used: int  # bytes the pod holds on this GPU
    compute_limit: int  # hundredths of a percent; 0 or COMPUTE_UNLIMITED = no compute limit
    generation: int
    compute_soft_limit: int = 0  # burst limit in hundredths; 0 = no burst
    device_flags: int = 0  # DEVICE_* bits
    host_memory_used: int = 0  # bytes in host-backed (oversubscribed) memory, not in memory_used
    gpu_ns: int = 0  # GPU time charged to the pod
    throttled_ns: int = 0  # time its launches waited for their share
    burst_ns: int = 0  # GPU time above the hard limit
    refusals: int = 0  # allocations refused at memory_limit
    refused_bytes_last: int = 0  # the size of the last one

    @property
    def limits(self) -> DeviceLimits:
        return DeviceLimits(
            self.memory_limit, self.compute_limit, self.compute_soft_limit, self.device_flags
        )

    @property
    def oversubscribe(self) -> bool:
        return bool(self.device_flags & DEVICE_OVERSUBSCRIBE)

    @property
    def compute_percent(self) -> float | None:
        """The compute limit in percent, None when there is none."""
        if self.compute_limit in (0, COMPUTE_UNLIMITED):
            return None
        return hundredths_to_percent(self.compute_limit)


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One claimed process slot as read at one moment."""

    slot: int
    pid: int  # in the process's own pid namespace
    host_pid: int  # in the node's namespace; 0 when not known
    pid_namespace: int  # inode of its /proc/<pid>/ns/pid
    start_time: int  # clock ticks after boot
    heartbeat_ns: int  # CLOCK_REALTIME of its last GPU call
    memory: dict[str, int] = field(default_factory=dict)  # bytes by device UUID
    host_memory: dict[str, int] = field(default_factory=dict)  # host-backed bytes by device UUID


Liveness = Callable[[ProcessInfo], bool]


# The library


@cache
def _library() -> Any:
    try:
        return ffi.dlopen(str(LIBRARY_PATH))
    except OSError as error:
        raise RegionError(f"{LIBRARY_PATH}: cannot load: {error}".replace("\n", " ")) from None


def native_library() -> Any:
    """libvgpu_region.so through cffi (RegionError when it cannot be loaded)."""
    return _library()


def _error_buffer() -> Any:
    return ffi.new("char[]", _ERROR_SIZE)


def _problem(header: Any, size: int) -> str | None:
    """What is wrong with a region file of ``size`` bytes and this header, None if nothing."""
    problem = _error_buffer()
    if _library().vgpu_region_check(header, size, problem, _ERROR_SIZE):
        return None
    return _text(problem)


# Liveness: vgpu_process_alive in C (gone, a zombie, or the pid now names a later process).


@cache
def own_pid_namespace() -> int:
    """Inode of this process's pid namespace; 0 if unknown."""
    try:
        return Path("/proc/self/ns/pid").stat().st_ino
    except OSError:
        return 0


def pid_alive(pid: int, start_time: int) -> bool:
    """Whether ``pid`` (in this process's namespace) is still the live process that started at
    ``start_time``; a zombie is dead, an unknown start time counts as alive, never as dead."""
    if not 0 < pid <= 0x7FFFFFFF:
        return False
    return bool(_library().vgpu_region_process_alive(pid, start_time & _U64))


def process_alive(process: ProcessInfo) -> bool:
    """Default liveness for :meth:`Region.reap`: by ``pid`` for processes of our own pid
    namespace, by ``host_pid`` when we are in the node's namespace. A process we cannot judge
    from here counts as alive: a slot is never reclaimed on a guess."""
    own = own_pid_namespace()
    if own != 0 and process.pid_namespace == own:
        return pid_alive(process.pid, process.start_time)
    if own == INIT_PID_NAMESPACE and process.host_pid > 0:
        return pid_alive(process.host_pid, process.start_time)
    return True


# Creating and opening


# A GPU's limits as a value, or as words: (memory, compute) or all of them.
DeviceSpec = GpuLimits | tuple[int, int] | DeviceLimits


def _as_limits(spec: DeviceSpec) -> DeviceLimits:
    if isinstance(spec, GpuLimits):
        limits = DeviceLimits.of(spec.over(NO_LIMITS))
    else:
        limits = spec if isinstance(spec, DeviceLimits) else DeviceLimits(spec[0], spec[1])
    limits.check()
    return limits


def _device_list(devices: Mapping[str, DeviceSpec]) -> Any:
    """The devices as the C array vgpu_region_create takes, checked."""
    entries: dict[str, DeviceLimits] = {}
    for uuid, spec in devices.items():
        canonical = normalize_uuid(uuid)
        if canonical in entries:
            raise ValueError(f"GPU {canonical} is given twice")
        entries[canonical] = _as_limits(spec)
    if len(entries) > MAX_DEVICES:
        raise ValueError(f"{len(entries)} GPUs given; a region holds at most {MAX_DEVICES}")
    array = ffi.new("struct vgpu_region_limits[]", max(len(entries), 1))
    for index, (uuid, limits) in enumerate(entries.items()):
        array[index].uuid = uuid.encode()
        limits.fill(array[index])
    return array, len(entries)


def create_region(
    path: str | os.PathLike[str],
    namespace: str,
    pod: str,
    devices: Mapping[str, DeviceSpec] | None = None,
    *,
    owner: int | None = None,
    group: int | None = None,
) -> Region:
    """Create the region file at ``path`` (folders included) with ``devices``, a mapping of GPU
    UUID to (memory limit in bytes, compute limit in hundredths of a percent), and open it.
    An existing region is opened as it is, never replaced. A new pod folder and file belong to
    ``owner`` and ``group`` when given (the pod's user or group; docs/security.md)."""
    path = Path(path)
    check_name("pod namespace", namespace)
    check_name("pod name", pod)
    array, count = _device_list(devices or {})
    error = _error_buffer()
    created = _library().vgpu_region_create(
        str(path.parent).encode(),
        namespace.encode(),
        pod.encode(),
        array,
        count,
        _OWNER_KEEP if owner is None else owner,
        _OWNER_KEEP if group is None else group,
        error,
        _ERROR_SIZE,
    )
    if created == _ERROR:
        raise RegionError(_text(error))
    return open_region(path)


def open_region(path: str | os.PathLike[str], *, writable: bool = True) -> Region:
    """Map an existing region file, checked first; RegionError names the file and the problem."""
    path = Path(path)
    error = _error_buffer()
    fd = _library().vgpu_region_open_file(
        str(path.parent).encode(), path.name.encode(), writable, error, _ERROR_SIZE
    )
    if fd < 0:
        raise RegionError(_text(error))
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mapping = mmap.mmap(fd, REGION_SIZE, flags=mmap.MAP_SHARED, prot=prot)
    except OSError as error:
        os.close(fd)
        raise RegionError(f"{path}: cannot map the pod region: {error.strerror}") from None
    except ValueError:
        # mmap's own size check: the file was cut short after the checks above (its tenant
        # may truncate it at any moment).
        os.close(fd)
        raise RegionError(f"{path}: truncated while being opened") from None
    except BaseException:
        os.close(fd)
        raise
    return Region(path, fd, mapping, writable)


# The region


class Region:
    """A mapped pod region. Reads are snapshots; changes go through libvgpu_region.so.

    Not for use after :meth:`close`; one object may be shared by threads.
    """

    def __init__(self, path: Path, fd: int, mapping: mmap.mmap, writable: bool) -> None:
        self.path = path
        self.writable = writable
        self._fd: int | None = fd
        self._mapping = mapping
        self._region: Any = ffi.from_buffer("struct vgpu_region *", mapping)
        self._thread_lock = threading.Lock()  # flock does not exclude threads of one process
        self._lock_shunned_until = 0.0  # _exclusive: a wait for the lock ran out lately

    # Life

    def close(self) -> None:
        """Unmap and close; later calls do nothing."""
        if self._fd is None:
            return
        ffi.release(self._region)
        self._mapping.close()
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> Region:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def _live(self) -> Any:
        if self._fd is None:
            raise RegionError(f"{self.path}: the region is closed")
        return self._region

    def _writable(self) -> Any:
        region = self._live()
        if not self.writable:
            raise RegionError(f"{self.path}: opened read-only")
        return region

    @contextmanager
    def _exclusive(self) -> Iterator[Any]:
        """The writers' lock (flock on the region file, as region.c takes it), waited for at
        most WRITERS_LOCK_WAIT_S: the file is the tenant's, and a process of its pod may hold
        the lock for as long as it likes. The limiter holds it for microseconds; the daemon,
        blocked on it, stopped every pass and every API change on the node (RegionError now:
        that pod's change fails, the others go on)."""
        region = self._writable()
        assert self._fd is not None
        with self._thread_lock:
            shunned = time.monotonic() < self._lock_shunned_until
            try:
                _take_writers_lock(self._fd, self.path, 0.0 if shunned else WRITERS_LOCK_WAIT_S)
            except RegionError:
                if not shunned:
                    self._lock_shunned_until = time.monotonic() + WRITERS_LOCK_SHUNNED_S
                raise
            try:
                yield region
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _call(self, result: int) -> int:
        """A library result; RegionError when the file shrank under the call."""
        if result == _FAULT:
            raise RegionError(f"{self.path}: truncated while in use")
        return result

    def _snapshot(self, size: int = REGION_SIZE) -> Any:
        """The first ``size`` bytes of the file, read (not mapped) into a private buffer."""
        self._live()
        assert self._fd is not None
        data = os.pread(self._fd, size, 0)
        if len(data) < size:
            raise RegionError(f"{self.path}: truncated ({len(data)} of {REGION_SIZE} bytes)")
        buffer = bytearray(REGION_SIZE)
        buffer[:size] = data
        return ffi.from_buffer("struct vgpu_region *", buffer)

    def problem(self) -> str | None:
        """What went wrong with the file since it was opened (shortened, overwritten), None if
        nothing."""
        self._live()
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size < REGION_SIZE:
            return f"truncated ({size} of {REGION_SIZE} bytes)"
        return _problem(self._snapshot(HEADER_SIZE), size)

    def cut_back(self) -> int | None:
        """Cut the file back to the region's size where it grew past it, in length or in space
        held beyond its end (``fallocate`` with ``FALLOC_FL_KEEP_SIZE``); the bytes it held
        then, None where it had not grown. Its tenant may write the file, and the file system
        under it is the node's: a grown region filled the base's tmpfs for every pod. Nothing
        maps past the region's size, so no process of the pod loses what it reads."""
        self._writable()
        assert self._fd is not None
        info = os.fstat(self._fd)
        held = max(info.st_size, info.st_blocks * 512)
        if info.st_size <= REGION_SIZE and held <= REGION_ROOM:
            return None
        os.ftruncate(self._fd, REGION_SIZE)  # at its size, the space past its end goes too
        return held

    # Header

    @property
    def namespace(self) -> str:
        header = self._snapshot(HEADER_SIZE)  # kept: the name points into its buffer
        return _text(header.pod_namespace)

    @property
    def pod(self) -> str:
        header = self._snapshot(HEADER_SIZE)  # kept: the name points into its buffer
        return _text(header.pod_name)

    @property
    def version(self) -> int:
        return int(self._snapshot(HEADER_SIZE).version)

    @property
    def created_ns(self) -> int:
        return int(self._snapshot(HEADER_SIZE).created_ns)

    @property
    def flags(self) -> int:
        return int(self._snapshot(HEADER_SIZE).flags)

    @property
    def freeze_epoch(self) -> int:
        return int(self._snapshot(HEADER_SIZE).freeze_epoch)

    @property
    def freeze_until_ns(self) -> int:
        """CLOCK_MONOTONIC time the freeze holds until (0: none)."""
        return int(self._snapshot(HEADER_SIZE).freeze_until_ns)

    @property
    def frozen(self) -> bool:
        """Whether the pod's launches wait now (frozen, and the deadline not passed)."""
        header = self._snapshot(HEADER_SIZE)
        until = int(header.freeze_until_ns)
        return bool(header.flags & FLAG_FROZEN) and until > time.monotonic_ns()

    def freeze(self, seconds: float, uuid: str | None = None) -> None:
        """Freeze the pod for ``seconds`` from now: every GPU, or with ``uuid`` that GPU (added
        to those frozen already; resume clears them). A whole-pod freeze after a GPU's holds
        every GPU (it held the marked ones only, while the pod read as frozen); a GPU's
        freeze of a pod frozen whole keeps it whole (it thawed the others)."""
        if not seconds > 0:
            raise ValueError(f"freeze time must be positive, got {seconds!r}")
        region = self._writable()
        if uuid is None:
            if self.frozen_gpus():
                for device in self.devices:
                    self._call(
                        int(_library().vgpu_region_safe_freeze_device(region, device.index, 0))
                    )
        elif not (self.frozen and not self.frozen_gpus()):
            index = self.device(uuid).index
            self._call(int(_library().vgpu_region_safe_freeze_device(region, index, 1)))
        self.renew_freeze(seconds)

    def renew_freeze(self, seconds: float) -> None:
        """Hold the freeze as it is (the GPUs it holds) for ``seconds`` from now."""
        if not seconds > 0:
            raise ValueError(f"freeze time must be positive, got {seconds!r}")
        until = time.monotonic_ns() + int(seconds * 1e9)
        self._call(int(_library().vgpu_region_safe_freeze(self._writable(), until)))

    def frozen_gpus(self) -> list[str]:
        """The GPUs a freeze holds when it holds only some ([]: all, when frozen)."""
        snapshot = self._snapshot()
        marked = _constant("VGPU_SCHED_FROZEN")
        return [
            _text(snapshot.devices[i].uuid)
            for i in range(int(snapshot.device_count))
            if snapshot.devices[i].scheduler_state[marked]
        ]

    def resume(self) -> None:
        """Resume a frozen pod; waiting launches are woken at once."""
        self._call(int(_library().vgpu_region_safe_resume(self._writable())))

    @property
    def qos(self) -> int:
        return int(self._snapshot(HEADER_SIZE).qos)

    @property
    def weight(self) -> int:
        return int(self._snapshot(HEADER_SIZE).weight)

    def set_policy(self, qos: int, weight: int = 0) -> None:
        """The pod's scheduling class (a Qos) and weight (0: the class's)."""
        if qos not in list(Qos):
            raise ValueError(f"unknown qos {qos}: one of {[int(known) for known in Qos]}")
        if not 0 <= weight <= MAX_WEIGHT:
            raise ValueError(f"bad weight {weight}: 0 (from the qos) to {MAX_WEIGHT}")
        self._call(int(_library().vgpu_region_safe_set_policy(self._writable(), qos, weight)))

    def set_effective(self, index: int, effective: int) -> None:
        """The scheduler's effective compute limit of device entry ``index`` (hundredths;
        0: the pod's own limit), stamped now."""
        stamp = time.monotonic_ns()
        region = self._writable()
        self._call(int(_library().vgpu_region_safe_set_effective(region, index, effective, stamp)))

    def effective(self, index: int) -> int:
        """The effective limit last published for device entry ``index`` (0: none)."""
        snapshot = self._snapshot()  # kept: the entry points into its buffer
        return int(snapshot.devices[index].scheduler_state[_constant("VGPU_SCHED_EFFECTIVE")])

    def set_burst(self, index: int, burst: int) -> None:
        """The scheduler's burst rate of device entry ``index``: what a pod with a soft limit may
        run at while other pods want the GPU (hundredths; 0: its hard limit), stamped now."""
        stamp = time.monotonic_ns()
        region = self._writable()
        self._call(int(_library().vgpu_region_safe_set_burst(region, index, burst, stamp)))

    def burst(self, index: int) -> int:
        """The burst rate last published for device entry ``index`` (0: none)."""
        snapshot = self._snapshot()  # kept: the entry points into its buffer
        return int(snapshot.devices[index].scheduler_state[_constant("VGPU_SCHED_BURST")])

    def change_flags(self, set: int = 0, clear: int = 0) -> int:
        """Set, then clear bits of the flags (FLAG_*); the flags after."""
        region = self._writable()
        result = _library().vgpu_region_safe_change_flags(region, set, clear)
        return self._call(int(result))

    # Devices

    def _device_count(self) -> int:
        return min(int(self._snapshot(HEADER_SIZE).device_count), MAX_DEVICES)

    def _read_device(self, index: int) -> DeviceInfo:
        view: Any = ffi.new("struct vgpu_region_device_view *")
        self._call(_library().vgpu_region_safe_read_device(self._live(), index, view))
        return DeviceInfo(
            index=index,
            uuid=_uuid_text(view.uuid),
            memory_limit=int(view.memory_limit),
            memory_used=int(view.memory_used),
            compute_limit=int(view.compute_limit),
            generation=int(view.generation),
            compute_soft_limit=int(view.compute_soft_limit),
            device_flags=int(view.device_flags),
            host_memory_used=int(view.host_memory_used),
            gpu_ns=int(view.gpu_ns),
            throttled_ns=int(view.throttled_ns),
            burst_ns=int(view.burst_ns),
            refusals=int(view.refusals),
            refused_bytes_last=int(view.refused_bytes_last),
        )

    @property
    def devices(self) -> list[DeviceInfo]:
        """The device entries in use."""
        return [self._read_device(index) for index in range(self._device_count())]

    def _find(self, uuid: str) -> int | None:
        for device in self.devices:
            if device.uuid.lower() == uuid.lower():
                return device.index
        return None

    def device(self, uuid: str) -> DeviceInfo:
        """The entry of one GPU; RegionError when the region has none."""
        canonical = normalize_uuid(uuid)
        index = self._find(canonical)
        if index is None:
            raise RegionError(f"{self.path}: no entry for GPU {canonical}")
        return self._read_device(index)

    def add_device(
        self, uuid: str, memory_limit: int = 0, compute_limit: int = 0, **more: int
    ) -> DeviceInfo:
        """Add a GPU's entry with its limits (written first, then published by device_count);
        ``more``: compute_soft_limit, device_flags (DeviceLimits' fields)."""
        canonical = normalize_uuid(uuid)
        limits = DeviceLimits(memory_limit, compute_limit, **more)
        limits.check()
        entry: Any = ffi.new("struct vgpu_region_limits *")
        entry.uuid = canonical.encode()
        limits.fill(entry)
        with self._exclusive() as region:
            index = self._call(_library().vgpu_region_safe_add_device(region, entry))
        if index == _EXISTS:
            raise RegionError(f"{self.path}: GPU {canonical} already has an entry")
        if index == _FULL:
            raise RegionError(f"{self.path}: all {MAX_DEVICES} device entries are in use")
        return self._read_device(index)

    def set_limits(
        self,
        uuid: str,
        memory_limit: int | None = None,
        compute_limit: int | None = None,
        *,
        compute_soft_limit: int | None = None,
        device_flags: int | None = None,
    ) -> DeviceInfo:
        """Change a GPU's limits live (None keeps one); running programs see all at once."""
        canonical = normalize_uuid(uuid)
        _check_limits(memory_limit, compute_limit)
        with self._exclusive() as region:
            present = self.device(canonical)
            now = present.limits
            limits = DeviceLimits(
                now.memory_limit if memory_limit is None else memory_limit,
                now.compute_limit if compute_limit is None else compute_limit,
                now.compute_soft_limit if compute_soft_limit is None else compute_soft_limit,
                now.device_flags if device_flags is None else device_flags,
            )
            limits.check()
            entry: Any = ffi.new("struct vgpu_region_limits *")
            limits.fill(entry)
            self._call(_library().vgpu_region_safe_store_limits(region, present.index, entry))
        return self._read_device(present.index)

    def restore_entries(self, entries: Mapping[int, str]) -> None:
        """Put each GPU (by UUID) back as the GPU of its entry (by index), the entries in use
        back up to each, under the writers' lock: a pod's running processes read the entry
        they found their GPU in, whatever a tenant renames it to since."""
        with self._exclusive() as region:
            for index, uuid in sorted(entries.items()):
                canonical = normalize_uuid(uuid).encode()
                self._call(_library().vgpu_region_safe_restore_entry(region, index, canonical))

    def change_limits(
        self,
        uuid: str,
        change: GpuLimits,
        base: Callable[[DeviceLimits], DeviceLimits] | None = None,
    ) -> DeviceLimits:
        """Make a change of a GPU's limits (an entry added for a GPU new to the pod), merged
        with the limits present under the writers' lock, so no other writer comes between, or
        with what ``base`` makes of them; the words written. ValueError (one line) for limits
        that cannot be (vgpu_common.limits' rules)."""
        canonical = normalize_uuid(uuid)
        entry: Any = ffi.new("struct vgpu_region_limits *")
        entry.uuid = canonical.encode()
        with self._exclusive() as region:
            index = self._find(canonical)
            try:
                words = None if index is None else self._read_device(index).limits
                words = words if words is None or base is None else base(words)
                present = NO_LIMITS if words is None else words.value
            except ValueError as error:  # words a tenant wrote: the file's state, not the change
                raise RegionError(f"{self.path}: GPU {canonical}: {error}") from None
            written = DeviceLimits.of(change.over(present))
            written.fill(entry)
            if index is None:
                index = self._call(_library().vgpu_region_safe_add_device(region, entry))
                if index == _FULL:
                    raise RegionError(f"{self.path}: all {MAX_DEVICES} device entries are in use")
            else:
                self._call(_library().vgpu_region_safe_store_limits(region, index, entry))
        return written

    def settle_generations(self) -> int:
        """Make even the generations left odd by writers that died mid-change (an odd one
        seen under the writers' lock has no live writer); the number settled."""
        with self._exclusive() as region:
            return self._call(_library().vgpu_region_safe_settle_generations(region))

    # Processes

    def _claimed_slots(self, snapshot: Any) -> list[int]:
        """Slots whose pid is > 0, from one strided view of the pid column: a daemon reads
        every region every second, and a cffi access per slot would cost ~1 ms a region."""
        with (
            memoryview(ffi.buffer(snapshot, REGION_SIZE)) as whole,
            whole[_PROCESS_OFFSET : _PROCESS_OFFSET + _PROCESS_BYTES] as table,
            table.cast("i") as words,
            words[_PID_INDEX :: _PROCESS_STRIDE // 4] as column,
        ):
            return [slot for slot, pid in enumerate(column) if pid > 0]

    @property
    def processes(self) -> list[ProcessInfo]:
        """The slots claimed by a process (alive or not yet reclaimed), as read at one moment."""
        snapshot = self._snapshot()
        count = min(int(snapshot.device_count), MAX_DEVICES)
        uuids = [_uuid_text(snapshot.devices[index].uuid) for index in range(count)]
        found = []
        for slot in self._claimed_slots(snapshot):
            entry = snapshot.processes[slot]
            found.append(
                ProcessInfo(
                    slot=slot,
                    pid=int(entry.pid),
                    host_pid=int(entry.host_pid),
                    pid_namespace=int(entry.pid_namespace),
                    start_time=int(entry.start_time),
                    heartbeat_ns=int(entry.heartbeat_ns),
                    memory={uuid: int(entry.memory[index]) for index, uuid in enumerate(uuids)},
                    host_memory={
                        uuid: int(entry.host_memory[index]) for index, uuid in enumerate(uuids)
                    },
                )
            )
        return found

    def set_host_pid(self, process: ProcessInfo, host_pid: int) -> bool:
        """Record the node-namespace pid of ``process``; False if its slot no longer holds it."""
        if not 0 <= host_pid <= 0x7FFFFFFF:
            raise ValueError(f"bad host pid {host_pid}")
        with self._exclusive() as region:
            result = _library().vgpu_region_safe_set_host_pid(
                region,
                process.slot,
                process.pid,
                process.pid_namespace,
                process.start_time,
                host_pid,
            )
        return self._call(result) == 0

    def reap(self, is_alive: Liveness = process_alive) -> list[ProcessInfo]:
        """Reclaim the slots of processes ``is_alive`` says are gone: their memory goes back to
        the pod exactly once, whoever else reaps at the same time, and a slot claimed again
        meanwhile by another process is left alone. The slots reclaimed."""
        region = self._writable()
        reclaim = _library().vgpu_region_safe_reclaim_process
        return [
            process
            for process in self.processes
            if not is_alive(process)
            and self._call(
                reclaim(
                    region, process.slot, process.pid, process.pid_namespace, process.start_time
                )
            )
            == 1
        ]


def _text(value: Any) -> str:
    """A NUL-terminated char array (not necessarily terminated in a corrupt file)."""
    data = ffi.string(value)
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _uuid_text(value: Any) -> str:
    """A stored UUID as NVML writes it (region.c stores it all lower case)."""
    text = _text(value)
    try:
        return normalize_uuid(text)
    except ValueError:
        return text
