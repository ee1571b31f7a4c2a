"""The pod region from Python: create, open, read and change it as vgpu_region.h describes.

The layout comes from the C header alone: the build preprocesses it into ``region_cdef.h``,
whose struct text goes to cffi (ABI mode, no compiler at run time) and whose ``#define VGPU_*``
lines give the constants. Nothing here restates a size, an offset or a value by hand.

Files. ``{base}/{namespace}/{pod}/shm``, mode 0o666 because a pod's processes may run as other
users than the daemon and must map it read-write. A new region is written complete into a
temporary file of the same folder and ``os.link``-ed into place: nobody sees it half written,
an existing one is never truncated or replaced, and of several concurrent creators one wins and
the others open its file.

Who writes what (the protocols of vgpu_region.h; Python keeps to them):

* Limits and device entries change under ``flock(LOCK_EX)`` on the region file itself, the lock
  the C side (region.c) takes for the same changes; the kernel drops it if its holder dies.
  Limits use the seqlock: generation made odd, limits stored, generation made even. Python's
  stores are plain aligned stores, one per field, in program order; that is a correct seqlock
  writer on x86-64 (stores are not reordered with stores). Elsewhere it needs the library's
  ``vgpu_region_store_limits`` (used when exported) and refuses otherwise. A generation found
  odd while holding the lock is a writer that died mid-change: the next writer, or
  :meth:`Region.settle_generations`, makes it even again so that readers do not spin forever.
* New device entries are written first and published by bumping ``device_count``.
* Reclaiming a dead process's slot is NOT done in Python. It needs a compare-and-swap on the
  slot's pid (so that of several reapers, C or Python, exactly one gives the memory back) and
  an atomic subtraction from the device's ``memory_used``, which live processes change with
  their own CAS loops at the same time: a Python read-modify-write there would lose their
  updates, whatever lock Python holds. So :meth:`Region.reap` judges liveness in Python and
  calls ``vgpu_region_reclaim_slot`` (or the identity-checked ``vgpu_region_reclaim_process``
  when the library has it) from libcuda_limiter.so through cffi's ``dlopen``. The library is
  inert when loaded and, loaded RTLD_LOCAL, interposes nothing in this process.
  With only the pid compare-and-swap, a slot freed and claimed again by another process with
  the same pid number (another container's pid namespace, or pid reuse) between our look and
  the swap would be taken for the dead one; Python re-reads the slot's identity just before the
  call to keep that window to microseconds, and the five-argument export closes it.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import platform
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from cffi import FFI

_HERE = Path(__file__).resolve().parent
CDEF_PATH: Final = _HERE / "region_cdef.h"
LIBRARY_PATH: Final = _HERE / "libcuda_limiter.so"

DEFAULT_BASE: Final = Path("/run/tensor-fusion/shm")
DEFAULT_NAMESPACE: Final = "default"
REGION_FILE: Final = "shm"

# Functions of libcuda_limiter.so that do what Python cannot do atomically (region.h).
_NATIVE_CDEF = """
bool vgpu_region_reclaim_slot(struct vgpu_region *region, unsigned slot, int32_t pid);
bool vgpu_region_reclaim_process(struct vgpu_region *region, unsigned slot, int32_t pid,
                                 uint64_t pid_namespace, uint64_t start_time);
void vgpu_region_store_limits(struct vgpu_region *region, unsigned entry,
                              uint64_t memory_limit, uint32_t compute_limit);
"""

_DEFINE = re.compile(
    r"#define\s+(VGPU_\w+)\s+\(?\s*(-?(?:0[xX][0-9a-fA-F]+|\d+))[uUlL]*\s*\)?\s*", re.ASCII
)


class RegionError(Exception):
    """A region file that cannot be used; the message is one line naming the file."""


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
                constants[match[1]] = int(match[2], 0)
        else:
            declarations.append(line)
    return "\n".join(declarations), constants


def _build_ffi() -> tuple[FFI, dict[str, int]]:
    declarations, constants = _read_cdef(CDEF_PATH)
    ffi = FFI()
    ffi.cdef(declarations)
    ffi.cdef(_NATIVE_CDEF)
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
REGION_SIZE: Final = ffi.sizeof("struct vgpu_region")
HEADER_SIZE: Final = ffi.offsetof("struct vgpu_region", "devices")
_PROCESS_OFFSET: Final = ffi.offsetof("struct vgpu_region", "processes")
_PROCESS_STRIDE: Final = ffi.sizeof("struct vgpu_region_process")
_PROCESS_BYTES: Final = _PROCESS_STRIDE * MAX_PROCESSES
_PID_INDEX: Final = ffi.offsetof("struct vgpu_region_process", "pid") // 4
assert _PROCESS_OFFSET % 4 == 0 and _PROCESS_STRIDE % 4 == 0 and ffi.sizeof("int32_t") == 4

_U32: Final = (1 << 32) - 1
_U64: Final = (1 << 64) - 1
# The pid namespace of the node (PROC_PID_INIT_INO): there, host pids are this kernel's pids.
INIT_PID_NAMESPACE: Final = 0xEFFFFFFC
# Seqlock reads: spin this often, then yield the CPU between tries, then give up.
_SPINS = 100
_SEQLOCK_TRIES = 2000

# Kubernetes names (DNS-1123) fit; "." and ".." and hidden or option-like names do not.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}", re.ASCII)
# As NVML writes it: "GPU-" and 32 hex digits in groups 8-4-4-4-12, any case.
_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


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


def normalize_uuid(uuid: str) -> str:
    """A GPU UUID as NVML writes it ("GPU-" and lower-case hex); ValueError if it is none."""
    if not _UUID.fullmatch(uuid):
        raise ValueError(
            f"bad GPU UUID {uuid!r}: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
        )
    return "GPU-" + uuid[4:].lower()


def _check_limits(memory_limit: int | None, compute_limit: int | None) -> None:
    if memory_limit is not None and not 0 <= memory_limit <= _U64:
        raise ValueError(f"bad memory limit {memory_limit}: bytes from 0 (no limit) to 2**64-1")
    if compute_limit is not None and not 0 <= compute_limit <= COMPUTE_UNLIMITED:
        raise ValueError(
            f"bad compute limit {compute_limit}: hundredths of a percent from 0 to "
            f"{COMPUTE_UNLIMITED} (both mean no limit)"
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

    @property
    def compute_percent(self) -> float | None:
        """The compute limit in percent, None when there is none."""
        if self.compute_limit in (0, COMPUTE_UNLIMITED):
            return None
        return self.compute_limit / 100


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


Liveness = Callable[[ProcessInfo], bool]


# Liveness, as vgpu_process_alive in C: gone, or the pid now names a process started later.


@cache
def own_pid_namespace() -> int:
    """Inode of this process's pid namespace; 0 if unknown."""
    try:
        return Path("/proc/self/ns/pid").stat().st_ino
    except OSError:
        return 0


def _start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat; 0 when unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    # The command name may hold spaces and parentheses: fields restart after the last ")".
    fields = text[text.rfind(b")") + 1 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0


def pid_alive(pid: int, start_time: int) -> bool:
    """Whether ``pid`` (in this process's namespace) is still the process that started at
    ``start_time``; unknown start times count as alive, never as dead."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, belongs to someone else
    now = _start_time(pid)
    return now == 0 or start_time in (0, now)


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


# The library's atomic operations


@cache
def _library() -> Any:
    try:
        return ffi.dlopen(str(LIBRARY_PATH))
    except OSError as error:
        raise RegionError(f"{LIBRARY_PATH}: cannot load: {error}".replace("\n", " ")) from None


def _native(name: str) -> Any | None:
    """A function of libcuda_limiter.so, None when this build does not export it."""
    try:
        return getattr(_library(), name)
    except AttributeError:
        return None


# Creating and opening


def _device_image(entry: Any, uuid: str, memory_limit: int, compute_limit: int) -> None:
    """Fill a free device entry; its UUID last, as a reader may look for it."""
    entry.memory_limit = memory_limit
    entry.compute_limit = compute_limit
    ffi.memmove(entry.uuid, uuid.encode().ljust(UUID_SIZE, b"\0"), UUID_SIZE)


def _region_image(namespace: str, pod: str, devices: list[tuple[str, int, int]]) -> bytes:
    """A complete region, zeros but for the header and the device entries."""
    image: Any = ffi.new("struct vgpu_region *")
    image.magic = MAGIC
    image.version = VERSION
    image.header_size = HEADER_SIZE
    image.total_size = REGION_SIZE
    image.created_ns = time.time_ns()
    ffi.memmove(image.pod_namespace, namespace.encode(), len(namespace))
    ffi.memmove(image.pod_name, pod.encode(), len(pod))
    for index, (uuid, memory_limit, compute_limit) in enumerate(devices):
        _device_image(image.devices[index], uuid, memory_limit, compute_limit)
    image.device_count = len(devices)
    return bytes(ffi.buffer(image))


def _device_list(devices: Mapping[str, tuple[int, int]]) -> list[tuple[str, int, int]]:
    entries: dict[str, tuple[str, int, int]] = {}
    for uuid, (memory_limit, compute_limit) in devices.items():
        canonical = normalize_uuid(uuid)
        if canonical in entries:
            raise ValueError(f"GPU {canonical} is given twice")
        _check_limits(memory_limit, compute_limit)
        entries[canonical] = (canonical, memory_limit, compute_limit)
    if len(entries) > MAX_DEVICES:
        raise ValueError(f"{len(entries)} GPUs given; a region holds at most {MAX_DEVICES}")
    return list(entries.values())


def _link_new(path: Path, image: bytes) -> None:
    """Write ``image`` to a private file of the folder and link it in as ``path``; an existing
    ``path`` (a concurrent creator's) is kept."""
    fd, temporary = tempfile.mkstemp(prefix=f"{REGION_FILE}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666)  # the pod's processes may run as other users
        with os.fdopen(fd, "wb") as stream:
            stream.write(image)
        with suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        Path(temporary).unlink()


def create_region(
    path: str | os.PathLike[str],
    namespace: str,
    pod: str,
    devices: Mapping[str, tuple[int, int]] | None = None,
) -> Region:
    """Create the region file at ``path`` (folders included) with ``devices``, a mapping of GPU
    UUID to (memory limit in bytes, compute limit in hundredths of a percent), and open it.
    An existing region is opened as it is, never replaced."""
    path = Path(path)
    check_name("pod namespace", namespace)
    check_name("pod name", pod)
    entries = _device_list(devices or {})
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            _link_new(path, _region_image(namespace, pod, entries))
    except OSError as error:
        raise RegionError(f"{path}: cannot create the pod region: {error.strerror}") from None
    return open_region(path)


def _problem(header: Any, size: int) -> str | None:
    """What is wrong with a region file, None if nothing."""
    if size < HEADER_SIZE:
        return f"too small for a pod region ({size} bytes)"
    problem = _layout_problem(header)
    if problem is not None:
        return problem
    if size < REGION_SIZE:
        return f"truncated ({size} of {REGION_SIZE} bytes)"
    if header.device_count > MAX_DEVICES:
        return f"corrupt device table (device_count {header.device_count})"
    return None


def _layout_problem(header: Any) -> str | None:
    """Whether the header describes this very layout."""
    if header.magic != MAGIC:
        return "not a pod region (bad magic)"
    if header.version != VERSION:
        return f"region version {header.version}, this vgpu-limiter reads version {VERSION}"
    if header.header_size != HEADER_SIZE or header.total_size != REGION_SIZE:
        return (
            f"unexpected layout (header {header.header_size}, total {header.total_size} bytes; "
            f"expected {HEADER_SIZE} and {REGION_SIZE})"
        )
    return None


def _check_file(path: Path, fd: int) -> None:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise RegionError(f"{path}: not a regular file")
    buffer = bytearray(REGION_SIZE)
    data = os.pread(fd, HEADER_SIZE, 0)
    buffer[: len(data)] = data
    header: Any = ffi.from_buffer("struct vgpu_region *", buffer)
    problem = _problem(header, info.st_size)
    if problem is not None:
        raise RegionError(f"{path}: {problem}")


def open_region(path: str | os.PathLike[str], *, writable: bool = True) -> Region:
    """Map an existing region file, checked first; RegionError names the file and the problem."""
    path = Path(path)
    try:
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RegionError(f"{path}: no such pod region") from None
    except OSError as error:
        raise RegionError(f"{path}: cannot open the pod region: {error.strerror}") from None
    try:
        _check_file(path, fd)
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mapping = mmap.mmap(fd, REGION_SIZE, flags=mmap.MAP_SHARED, prot=prot)
    except OSError as error:
        os.close(fd)
        raise RegionError(f"{path}: cannot map the pod region: {error.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    return Region(path, fd, mapping, writable)


# The region


class Region:
    """A mapped pod region. Reads are snapshots; changes follow vgpu_region.h's protocols.

    Not for use after :meth:`close`; one object may be shared by threads.
    """

    def __init__(self, path: Path, fd: int, mapping: mmap.mmap, writable: bool) -> None:
        self.path = path
        self.writable = writable
        self._fd: int | None = fd
        self._mapping = mapping
        self._region: Any = ffi.from_buffer("struct vgpu_region *", mapping)
        self._thread_lock = threading.Lock()  # flock does not exclude threads of one process

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
        """The writers' lock (flock on the region file, as region.c takes it)."""
        region = self._writable()
        assert self._fd is not None
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield region
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def problem(self) -> str | None:
        """What went wrong with the file since it was opened (shortened, overwritten), None if
        nothing. Check before reading a region someone else may damage: a mapped file that
        shrank turns a read past its end into SIGBUS."""
        region = self._live()
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size < REGION_SIZE:
            return f"truncated ({size} of {REGION_SIZE} bytes)"
        return _problem(region, size)

    # Header

    @property
    def namespace(self) -> str:
        return _text(self._live().pod_namespace)

    @property
    def pod(self) -> str:
        return _text(self._live().pod_name)

    @property
    def version(self) -> int:
        return int(self._live().version)

    @property
    def created_ns(self) -> int:
        return int(self._live().created_ns)

    @property
    def flags(self) -> int:
        return int(self._live().flags)

    @property
    def freeze_epoch(self) -> int:
        return int(self._live().freeze_epoch)

    # Devices

    def _device_count(self, region: Any) -> int:
        return min(int(region.device_count), MAX_DEVICES)

    def _read_device(self, region: Any, index: int) -> DeviceInfo:
        entry = region.devices[index]
        for attempt in range(_SEQLOCK_TRIES):
            before = entry.generation
            memory_limit = entry.memory_limit
            compute_limit = entry.compute_limit
            if before % 2 == 0 and entry.generation == before:
                break
            if attempt >= _SPINS:
                time.sleep(0)
        # After the last try (a writer died mid-change): the values as they are.
        return DeviceInfo(
            index=index,
            uuid=_uuid_text(entry.uuid),
            memory_limit=int(memory_limit),
            memory_used=int(entry.memory_used),
            compute_limit=int(compute_limit),
            generation=int(before),
        )

    @property
    def devices(self) -> list[DeviceInfo]:
        """The device entries in use."""
        region = self._live()
        return [self._read_device(region, index) for index in range(self._device_count(region))]

    def _find(self, region: Any, uuid: str) -> int | None:
        for index in range(self._device_count(region)):
            if _uuid_text(region.devices[index].uuid).lower() == uuid.lower():
                return index
        return None

    def device(self, uuid: str) -> DeviceInfo:
        """The entry of one GPU; RegionError when the region has none."""
        canonical = normalize_uuid(uuid)
        region = self._live()
        index = self._find(region, canonical)
        if index is None:
            raise RegionError(f"{self.path}: no entry for GPU {canonical}")
        return self._read_device(region, index)

    def add_device(self, uuid: str, memory_limit: int = 0, compute_limit: int = 0) -> DeviceInfo:
        """Add a GPU's entry with its limits (written first, then published by device_count)."""
        canonical = normalize_uuid(uuid)
        _check_limits(memory_limit, compute_limit)
        with self._exclusive() as region:
            if self._find(region, canonical) is not None:
                raise RegionError(f"{self.path}: GPU {canonical} already has an entry")
            index = int(region.device_count)
            if index >= MAX_DEVICES:
                raise RegionError(f"{self.path}: all {MAX_DEVICES} device entries are in use")
            entry = region.devices[index]
            if entry.generation % 2:
                entry.generation = (entry.generation + 1) & _U32
            _device_image(entry, canonical, memory_limit, compute_limit)
            region.device_count = index + 1
            return self._read_device(region, index)

    def set_limits(
        self, uuid: str, memory_limit: int | None = None, compute_limit: int | None = None
    ) -> DeviceInfo:
        """Change a GPU's limits live (None keeps one); running programs see both at once."""
        canonical = normalize_uuid(uuid)
        _check_limits(memory_limit, compute_limit)
        with self._exclusive() as region:
            index = self._find(region, canonical)
            if index is None:
                raise RegionError(f"{self.path}: no entry for GPU {canonical}")
            entry = region.devices[index]
            memory = entry.memory_limit if memory_limit is None else memory_limit
            compute = entry.compute_limit if compute_limit is None else compute_limit
            self._store_limits(region, index, memory, compute)
            return self._read_device(region, index)

    def _store_limits(self, region: Any, index: int, memory: int, compute: int) -> None:
        """The seqlock writer; the caller holds the writers' lock."""
        native = _native("vgpu_region_store_limits")
        if native is not None:
            native(region, index, memory, compute)
            return
        if platform.machine() not in ("x86_64", "AMD64"):
            raise RegionError(
                f"{LIBRARY_PATH}: no vgpu_region_store_limits, needed to change limits on "
                f"{platform.machine()}"
            )
        entry = region.devices[index]
        odd = entry.generation | 1  # already odd: a writer died mid-change; we finish it
        entry.generation = odd
        entry.memory_limit = memory
        entry.compute_limit = compute
        entry.generation = (odd + 1) & _U32

    def settle_generations(self) -> int:
        """Make even the generations left odd by writers that died mid-change (an odd one
        seen under the writers' lock has no live writer); the number settled."""
        settled = 0
        with self._exclusive() as region:
            for index in range(self._device_count(region)):
                entry = region.devices[index]
                if entry.generation % 2:
                    entry.generation = (entry.generation + 1) & _U32
                    settled += 1
        return settled

    # Processes

    def _read_process(self, region: Any, slot: int, uuids: list[str]) -> ProcessInfo | None:
        entry = region.processes[slot]
        pid = entry.pid
        if pid <= 0:
            return None
        process = ProcessInfo(
            slot=slot,
            pid=int(pid),
            host_pid=int(entry.host_pid),
            pid_namespace=int(entry.pid_namespace),
            start_time=int(entry.start_time),
            heartbeat_ns=int(entry.heartbeat_ns),
            memory={uuid: int(entry.memory[index]) for index, uuid in enumerate(uuids)},
        )
        return process if entry.pid == pid else None

    def _claimed_slots(self) -> list[int]:
        """Slots whose pid is > 0, from one strided view of the pid column: a daemon reads
        every region every second, and a cffi access per slot would cost ~1 ms a region."""
        self._live()
        # Released on the way out: a mapping with views left cannot be closed.
        with (
            memoryview(self._mapping) as whole,
            whole[_PROCESS_OFFSET : _PROCESS_OFFSET + _PROCESS_BYTES] as table,
            table.cast("i") as words,
            words[_PID_INDEX :: _PROCESS_STRIDE // 4] as column,
        ):
            return [slot for slot, pid in enumerate(column) if pid > 0]

    @property
    def processes(self) -> list[ProcessInfo]:
        """The slots claimed by a process (alive or not yet reclaimed)."""
        region = self._live()
        uuids = [_uuid_text(region.devices[i].uuid) for i in range(self._device_count(region))]
        found = (self._read_process(region, slot, uuids) for slot in self._claimed_slots())
        return [process for process in found if process is not None]

    def _same(self, region: Any, process: ProcessInfo) -> bool:
        entry = region.processes[process.slot]
        return bool(
            entry.pid == process.pid
            and entry.pid_namespace == process.pid_namespace
            and entry.start_time == process.start_time
        )

    def set_host_pid(self, process: ProcessInfo, host_pid: int) -> bool:
        """Record the node-namespace pid of ``process``; False if its slot no longer holds it.

        A host pid left on a slot that another process claimed would make that live process
        look dead, so the store is checked again after it and undone if the slot changed (a
        claimer clears host_pid before it publishes its pid)."""
        if not 0 <= host_pid <= 0x7FFFFFFF:
            raise ValueError(f"bad host pid {host_pid}")
        with self._exclusive() as region:
            entry = region.processes[process.slot]
            if not self._same(region, process):
                return False
            entry.host_pid = host_pid
            if self._same(region, process):
                return True
            entry.host_pid = 0
            return False

    def reap(self, is_alive: Liveness = process_alive) -> list[ProcessInfo]:
        """Reclaim the slots of processes ``is_alive`` says are gone: their memory goes back to
        the pod exactly once, whoever else reaps at the same time. The slots reclaimed."""
        region = self._writable()
        reclaim = self._reclaimer()
        return [
            process
            for process in self.processes
            if not is_alive(process) and reclaim(region, process)
        ]

    def _reclaimer(self) -> Callable[[Any, ProcessInfo], bool]:
        """The library's reclaim of one slot, checked against the process's identity."""
        checked = _native("vgpu_region_reclaim_process")
        if checked is not None:
            return lambda region, process: bool(
                checked(
                    region, process.slot, process.pid, process.pid_namespace, process.start_time
                )
            )
        plain = _native("vgpu_region_reclaim_slot")
        if plain is None:
            raise RegionError(f"{LIBRARY_PATH}: does not export vgpu_region_reclaim_slot")
        return lambda region, process: (
            self._same(region, process) and bool(plain(region, process.slot, process.pid))
        )


def _text(value: Any) -> str:
    """A NUL-terminated char array (not necessarily terminated in a corrupt file)."""
    data = ffi.string(value)
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _uuid_text(value: Any) -> str:
    """A stored UUID as NVML writes it (region.c stores it all lower case)."""
    text = _text(value)
    return normalize_uuid(text) if _UUID.fullmatch(text) else text
