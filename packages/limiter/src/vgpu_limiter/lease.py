"""The node-wide device lease files from Python (vgpu_region.h, ``struct vgpu_device_lease`` and
``struct vgpu_device_node``), made and checked by the rules the limiter keeps (lease_file.c).

``{base}/.devices/{uuid}``: one lease per GPU, mapped read-write by every limited process that
paces work on it (and only read here, never mapped: its writers could truncate it under a
mapping). Its folder is 0o3770 (the leases belong to its group; only their owner removes
them), each lease 0o660. ``{base}/.node/{uuid}``: what only the node daemon says about the GPU
(its boost: how much faster than at its power limit the GPU runs its work now, which the
limiter multiplies the GPU time it charges by), 0o644 in a 0o755 folder, read-only to everyone
else. Nothing is opened through a symlink or a second hard link, nothing world-writable is used,
and file space is allocated before a file is mapped, so a full disk is an error, not a SIGBUS.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import stat
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from vgpu_common.limits import normalize_uuid

from .region import CONSTANTS, RegionError, ffi

if TYPE_CHECKING:
    from .lease_broker import ArbitratedLease

LEASE_FOLDER: Final = ".devices"
NODE_FOLDER: Final = ".node"
LEASE_FOLDER_MODE: Final = 0o3770
LEASE_MODE: Final = 0o660
NODE_FOLDER_MODE: Final = 0o755
NODE_MODE: Final = 0o644
BOOST_ONE: Final = CONSTANTS["VGPU_BOOST_ONE"]
BOOST_MAX: Final = CONSTANTS["VGPU_BOOST_MAX"]
_SIZE: Final = ffi.sizeof("struct vgpu_device_lease")
_NODE_SIZE: Final = ffi.sizeof("struct vgpu_device_node")
_NOFOLLOW: Final = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OFFSETS: Final = {
    field: ffi.offsetof("struct vgpu_device_lease", field)
    for field in ("magic", "version", "activity_ns", "busy_ns")
}


def lease_path(base: str | os.PathLike[str], uuid: str) -> Path:
    return Path(base) / LEASE_FOLDER / normalize_uuid(uuid)


def node_path(base: str | os.PathLike[str], uuid: str) -> Path:
    return Path(base) / NODE_FOLDER / normalize_uuid(uuid)


def folder_fd(path: Path, mode: int | None) -> int:
    """The folder as a checked directory fd; made with ``mode`` when that is given and it is
    missing. Refused: a symlink, anything but a directory, a world-writable folder."""
    made = False
    if mode is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(0o700)  # opened to others only once it is checked ours
            made = True
        except FileExistsError:
            pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise RegionError(f"{path}: not a directory (a symlink?)") from None
        raise
    info = os.fstat(fd)
    if made and mode is not None and info.st_uid == os.geteuid():
        os.fchmod(fd, mode)
        info = os.fstat(fd)
    if info.st_mode & stat.S_IWOTH:
        os.close(fd)
        raise RegionError(f"{path}: world-writable (made by an older version? remove it)")
    return fd


def _checked_open(folder: int, name: str, flags: int, shown: Path) -> tuple[int, os.stat_result]:
    """Open an existing file of the folder without following a symlink or blocking on a FIFO,
    and check what was opened: a regular file with one link (a hard link could be any file of
    the file system), the inode the name named, not world-writable."""
    named = os.stat(name, dir_fd=folder, follow_symlinks=False)
    if not stat.S_ISREG(named.st_mode):
        kind = "a symlink" if stat.S_ISLNK(named.st_mode) else "not a regular file"
        raise RegionError(f"{shown}: {kind}")
    fd = os.open(name, flags | _NOFOLLOW, dir_fd=folder)
    info = os.fstat(fd)
    wrong = None
    if (info.st_ino, info.st_dev) != (named.st_ino, named.st_dev) or not stat.S_ISREG(info.st_mode):
        wrong = "replaced while opened"
    elif info.st_nlink != 1:
        wrong = "a file with other links"
    elif info.st_mode & stat.S_IWOTH:
        wrong = "world-writable (made by an older version? remove it)"
    if wrong is not None:
        os.close(fd)
        raise RegionError(f"{shown}: {wrong}")
    return fd, info


def _allocate(fd: int, size: int, shown: Path) -> None:
    """Real file space for ``size`` bytes: a full disk is an error here, not a SIGBUS later."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        raise RegionError(f"{shown}: cannot allocate it: {error.strerror}") from None
    if os.fstat(fd).st_size != size:
        raise RegionError(f"{shown}: not the size of a {'lease' if size == _SIZE else 'node file'}")


def _create(folder: int, name: str, mode: int, size: int, shown: Path) -> int | None:
    """A new file of ``size`` allocated bytes, or None when it exists already."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode, dir_fd=folder)
    except FileExistsError:
        return None
    try:
        os.fchmod(fd, mode)  # whatever the umask
        _allocate(fd, size, shown)
    except BaseException:
        os.close(fd)
        os.unlink(name, dir_fd=folder)  # nothing half made is left behind
        raise
    return fd


def _open_lease(folder: int, name: str, shown: Path) -> int:
    fd = _create(folder, name, LEASE_MODE, _SIZE, shown)
    if fd is not None:
        return fd
    fd, info = _checked_open(folder, name, os.O_RDWR, shown)
    try:
        group = os.fstat(folder).st_gid
        if info.st_uid not in (os.geteuid(), 0) and info.st_gid != group:
            raise RegionError(f"{shown}: owned by a user outside the folder's group")
        if info.st_uid == os.geteuid() and info.st_gid != group:
            # The folder was given to a group after this lease was made (`chgrp gpu-users
            # .devices`): the lease follows, or the group's users could not open it.
            os.fchown(fd, -1, group)
        _allocate(fd, _SIZE, shown)  # a planted sparse file gets its space too
    except BaseException:
        os.close(fd)
        raise
    return fd


def _start_lease(fd: int) -> None:
    """Stamp the lease's header (magic and version) unless it is this version's: a new lease is
    all zeros (free), and any other header is a sharer's scribble (or an older version's, whose
    words mean the same), which the limiter stamps again too rather than refuse the GPU's lease
    for good."""
    magic, version = _OFFSETS["magic"], _OFFSETS["version"]
    header = os.pread(fd, version + 4, 0)
    if (
        int.from_bytes(header[magic : magic + 8], sys.byteorder) != CONSTANTS["VGPU_LEASE_MAGIC"]
        or int.from_bytes(header[version:], sys.byteorder) != CONSTANTS["VGPU_LEASE_VERSION"]
    ):
        os.pwrite(fd, CONSTANTS["VGPU_LEASE_VERSION"].to_bytes(4, sys.byteorder), version)
        os.pwrite(fd, CONSTANTS["VGPU_LEASE_MAGIC"].to_bytes(8, sys.byteorder), magic)


def _map_node(base: Path, name: str) -> tuple[mmap.mmap | None, bool]:
    """The GPU's node file and whether this process writes it: made when this process may make
    it (root, or the owner of the node folder); otherwise read-only when the limiter would trust
    it, else None."""
    shown = base / NODE_FOLDER / name
    try:
        folder = folder_fd(base / NODE_FOLDER, NODE_FOLDER_MODE)
    except PermissionError:
        return None, False  # not the daemon, and no daemon has made it
    try:
        info = os.fstat(folder)
        if info.st_mode & stat.S_IWGRP:
            raise RegionError(f"{base / NODE_FOLDER}: writable by others than its owner")
        owner = info.st_uid
        if os.geteuid() == 0 and owner != 0:  # its owner's node files would be believed
            raise RegionError(f"{base / NODE_FOLDER}: owned by uid {owner}, not root: remove it")
        writer = os.geteuid() in (0, owner)
        fd = _create(folder, name, NODE_MODE, _NODE_SIZE, shown) if writer else None
        if fd is None:
            try:
                fd, info = _checked_open(folder, name, os.O_RDWR if writer else os.O_RDONLY, shown)
            except FileNotFoundError:
                return None, False
            if info.st_uid not in (0, owner) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                os.close(fd)
                if writer:
                    raise RegionError(f"{shown}: not the daemon's (or writable by others)")
                return None, False
        try:
            if writer:
                _allocate(fd, _NODE_SIZE, shown)
            access = mmap.PROT_READ | (mmap.PROT_WRITE if writer else 0)
            return mmap.mmap(fd, _NODE_SIZE, mmap.MAP_SHARED, access), writer
        finally:
            os.close(fd)
    finally:
        os.close(folder)


class DeviceLease:
    """One GPU's lease file (read, never mapped) and its node file, mapped (written when this
    process is the daemon: root or the node folder's owner).
    ``with DeviceLease.open(base, uuid) as lease:``"""

    def __init__(
        self,
        path: Path,
        fd: int,
        node: mmap.mmap | None,
        writer: bool,
        arbitrated: ArbitratedLease | None = None,
    ) -> None:
        self.path = path
        self._fd: int | None = fd
        self._arbitrated = arbitrated
        self._node_mapping = node
        self._node_buffer: Any = None
        self._node: Any = None
        if node is not None:
            self._node_buffer = ffi.from_buffer(node)
            self._node = ffi.cast("struct vgpu_device_node *", self._node_buffer)
        self._writer = writer

    @classmethod
    def open(
        cls, base: str | os.PathLike[str], uuid: str, *, arbitrated: ArbitratedLease | None = None
    ) -> DeviceLease:
        """Map the GPU's lease, creating it (and its folder) when missing, and its node file;
        RegionError when a file cannot be made or breaks the rules. With ``arbitrated`` (the
        daemon's, lease_broker.py) the words are read from its lease, and the node file names
        its arbiter, so that the limiters connect to it; the lease file stays for processes
        that cannot reach the daemon."""
        name = normalize_uuid(uuid)
        path = lease_path(base, name)
        try:
            folder = folder_fd(path.parent, LEASE_FOLDER_MODE)
            try:
                fd = _open_lease(folder, name, path)
            finally:
                os.close(folder)
        except OSError as error:
            raise RegionError(f"{path}: cannot open the device lease: {error.strerror}") from None
        try:
            _start_lease(fd)
            node, writer = _map_node(Path(base), name)
        except OSError as error:
            os.close(fd)
            raise RegionError(f"{path}: cannot open the node file: {error.strerror}") from None
        except BaseException:
            os.close(fd)
            raise
        lease = cls(path, fd, node, writer, arbitrated)
        if writer and lease._node.magic == 0:
            lease._node.version = CONSTANTS["VGPU_NODE_VERSION"]
            lease._node.magic = CONSTANTS["VGPU_NODE_MAGIC"]  # last: the file is complete
        if arbitrated is not None:
            if not writer:
                lease.close()
                raise RegionError(f"{path}: only the node daemon arbitrates leases")
            lease._node.lease_instance = arbitrated.instance
        return lease

    def lease_instance(self) -> int:
        """The daemon arbiter the node file names (0: none)."""
        return int(self._node.lease_instance) if self._node is not None else 0

    def publish_boost(self, boost: float) -> int:
        """Publish the GPU's boost factor (>= 1; clamped to the limiter's range); the stored
        value, in parts per BOOST_ONE. The time is written last: a reader that sees it fresh
        sees a value written by this daemon."""
        if not math.isfinite(boost):
            raise ValueError(f"boost must be a finite number, not {boost!r}")
        if not self._writer:
            raise RegionError(f"{self.path}: only the node daemon (root) publishes the boost")
        parts = min(BOOST_MAX, max(BOOST_ONE, round(boost * BOOST_ONE)))
        self._node.boost = parts
        self._node.boost_ns = time.monotonic_ns()
        return int(parts)

    def publish_context_charge(self, charge: int) -> None:
        """Publish the device memory each CUDA context on this GPU is charged (bytes; 0: none):
        the limiter charges a context the larger of this and its process's own setting."""
        if charge < 0:
            raise ValueError(f"a context charge cannot be negative: {charge}")
        if not self._writer:
            raise RegionError(f"{self.path}: only the node daemon publishes the context charge")
        self._node.context_charge = charge

    def context_charge(self) -> int:
        """The context charge the node file names (0: none)."""
        return int(self._node.context_charge) if self._node is not None else 0

    def boost(self) -> float | None:
        """The published boost, or None when none is published or it is stale (as the
        limiter judges it)."""
        node = self._node
        if node is None or node.magic != CONSTANTS["VGPU_NODE_MAGIC"]:
            return None
        parts, written = int(node.boost), int(node.boost_ns)
        now = time.monotonic_ns()
        if parts == 0 or written > now or now - written > CONSTANTS["VGPU_BOOST_STALE_NS"]:
            return None
        return min(BOOST_MAX, max(BOOST_ONE, parts)) / BOOST_ONE

    def active_within(self, seconds: float) -> bool:
        """Whether a limited process ran an epoch on the GPU in the last ``seconds``."""
        last = self.last_active()
        return last is not None and time.monotonic() - last <= seconds

    def last_active(self) -> float | None:
        """When a limited process last ran an epoch on the GPU (its grant or its last GPU call
        while holding the lease), in seconds of ``time.monotonic()``; None when none has, or the
        word says a time in the future, which no process of this node writes. Where the daemon
        arbitrates the lease it writes the word itself; in a lease file a tenant may."""
        activity = self._word("activity_ns")
        if activity == 0 or activity > time.monotonic_ns():
            return None
        return activity / 1e9

    def busy_ns(self) -> int:
        """The GPU time of every paced epoch so far, as the limiter measured it (nanoseconds,
        before the boost). A tenant may write it: only a bound may be drawn from it."""
        return self._word("busy_ns")

    def withdraw_boost(self) -> None:
        """Stop correcting: the limiter charges plain GPU time again."""
        if self._writer:
            self._node.boost = 0

    def close(self) -> None:
        """Unmap and close; later calls do nothing."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._node is not None and self._node_mapping is not None:
            self._node = None
            ffi.release(self._node_buffer)  # a mapping with views left cannot be closed
            self._node_mapping.close()

    def _word(self, field: str) -> int:
        """A 64-bit word of the lease, read (not mapped: a tenant may truncate the file, and a
        read of a short file is 0 where a mapping's would be SIGBUS); 0 once closed."""
        if self._fd is None:
            return 0
        if self._arbitrated is not None:
            return self._arbitrated.word(_OFFSETS[field])
        data = os.pread(self._fd, 8, _OFFSETS[field])
        return int.from_bytes(data, sys.byteorder) if len(data) == 8 else 0

    def __enter__(self) -> DeviceLease:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
