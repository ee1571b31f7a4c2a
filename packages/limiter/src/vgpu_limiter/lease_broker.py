"""The node daemon's device leases (vgpu_region.h, ``VGPU_LEASE_SOCKET``), arbitrated by the
daemon itself.

A lease file under ``{base}/.devices`` is mapped read-write by every paced process, so any of
them could truncate it (killing the others with SIGBUS) or write its owner word (making other
pods wait, or pace without exclusivity). With a daemon no lease is shared: a thread of the
region library (arbiter.c, in C so that a hand-over never waits for this interpreter) listens on
``{base}/.node/leases.sock``, gives each paced process a seat of its own (a sealed memfd only it
and the daemon map), and decides alone who holds each GPU's lease. A tenant can write only its
own seat, so it can mislead the arbiter only about itself.

The node file of each GPU names the arbiter's instance, so that processes pacing with something
else (an earlier daemon's arbiter, or a lease file) connect to this one between two epochs. The
daemon keeps each GPU's lease words (activity, epochs, busy time) in a memfd of its own, which
the arbiter writes and the boost estimate reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import secrets
import socket
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from vgpu_common.limits import normalize_uuid

from .lease import NODE_FOLDER, NODE_FOLDER_MODE, DeviceLease, folder_fd
from .region import CONSTANTS, RegionError, ffi, native_library

SOCKET_NAME: Final = "leases.sock"
SOCKET_MODE: Final = 0o666  # every paced process of the node asks for leases
_SIZE: Final = ffi.sizeof("struct vgpu_device_lease")
_SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
BACKLOG: Final = 4096  # the kernel caps it (somaxconn): a burst of connections waits its turn
PROBE_TIMEOUT_S: Final = 0.2
_ERROR_SIZE: Final = 512

log = logging.getLogger(__name__)


class ArbitratedLease:
    """One GPU's lease words, kept by the arbiter in a memfd of the daemon's own (handed to no
    other process) and mapped here for the daemon to read."""

    def __init__(self, uuid: str, instance: int) -> None:
        self.uuid = normalize_uuid(uuid)
        self.instance = instance
        self.fd = os.memfd_create(f"vgpu-lease-{self.uuid}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, _SIZE)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEALS)
            self.mapping = mmap.mmap(self.fd, _SIZE, mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.mapping[0:8] = CONSTANTS["VGPU_LEASE_MAGIC"].to_bytes(8, sys.byteorder)
        version = ffi.offsetof("struct vgpu_device_lease", "version")
        self.mapping[version : version + 4] = CONSTANTS["VGPU_LEASE_VERSION"].to_bytes(
            4, sys.byteorder
        )

    def word(self, offset: int) -> int:
        """The 64-bit word at ``offset``."""
        return int.from_bytes(self.mapping[offset : offset + 8], sys.byteorder)

    def close(self) -> None:
        self.mapping.close()
        os.close(self.fd)


def _answers(address: str) -> bool:
    """Whether a daemon listens on the socket at ``address`` now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(address)
    except OSError:
        return False
    finally:
        probe.close()
    return True


@dataclass(frozen=True)
class ArbiterStats:
    """What the arbiter counted: connections now, refused or dropped ones, grants, and grants
    taken back (of them, ``overruns`` from holders past the hold); ``strangers``: HELLOs for a
    GPU whose device the process did not hold open (not served); ``newcomers``: pods that
    began to ask for a lease after a second or more without (the daemon makes a pass soon)."""

    clients: int
    refused: int
    grants: int
    taken_back: int
    overruns: int
    strangers: int = 0
    newcomers: int = 0


class LeaseBroker:
    """Every GPU's lease, arbitrated on ``{base}/.node/leases.sock`` by the region library's
    thread, with the GPUs' node files naming the arbiter. ``start`` once, ``close`` once."""

    def __init__(
        self,
        base: str | os.PathLike[str],
        uuids: Sequence[str],
        context_charge: int = 0,
        devices: Mapping[str, int] | None = None,
    ) -> None:
        """``context_charge``: the device memory each CUDA context is charged, published in
        every GPU's node file (0: none; processes then charge their own setting). ``devices``:
        each GPU's character device number (``st_rdev`` of its /dev/nvidiaN) by UUID: a process
        is served a GPU's lease only while it holds that device open (a GPU not named: any
        process that connects is, as for a simulated GPU, which has no device file)."""
        self.base = Path(base)
        self.context_charge = context_charge
        self._devices = {normalize_uuid(uuid): rdev for uuid, rdev in (devices or {}).items()}
        self.instance = secrets.randbits(63) | 1
        self._leases = [
            ArbitratedLease(uuid, self.instance)
            for uuid in dict.fromkeys(map(normalize_uuid, uuids))
        ]
        self._device_leases: dict[str, DeviceLease] = {}
        self._arbiter: Any = None
        self._bound: tuple[int, int] | None = None  # the socket file this broker made
        self.path = self.base / NODE_FOLDER / SOCKET_NAME

    @property
    def uuids(self) -> list[str]:
        return [lease.uuid for lease in self._leases]

    def lease(self, uuid: str) -> ArbitratedLease | None:
        wanted = normalize_uuid(uuid)
        return next((lease for lease in self._leases if lease.uuid == wanted), None)

    def device_lease(self, uuid: str) -> DeviceLease | None:
        """The GPU's DeviceLease (its node file, written here, and the arbitrated lease's words)."""
        return self._device_leases.get(normalize_uuid(uuid))

    def start(self) -> None:
        """Listen and arbitrate, then name the arbiter in the node files; RegionError or OSError
        when the node folder or the socket cannot be made, or another daemon arbitrates there."""
        listener = self._listen()
        try:
            self._arbiter = _start_arbiter(listener, self.instance, self._leases, self._devices)
        finally:
            listener.close()  # the arbiter holds its own descriptor
        for lease in self._leases:
            device = DeviceLease.open(self.base, lease.uuid, arbitrated=lease)
            self._device_leases[lease.uuid] = device
            device.publish_context_charge(self.context_charge)

    def stats(self) -> ArbiterStats:
        """The arbiter's counts now (zeros before ``start``)."""
        if self._arbiter is None:
            return ArbiterStats(0, 0, 0, 0, 0)
        counts: Any = ffi.new("struct vgpu_arbiter_stats *")
        native_library().vgpu_arbiter_read_stats(self._arbiter, counts)
        return ArbiterStats(
            counts.clients,
            counts.refused,
            counts.grants,
            counts.taken_back,
            counts.overruns,
            counts.strangers,
            counts.newcomers,
        )

    def _listen(self) -> socket.socket:
        folder = folder_fd(self.base / NODE_FOLDER, NODE_FOLDER_MODE)
        try:
            # Reached through the folder's descriptor: a base path of any length fits a socket
            # address, and only the folder's owner (this daemon) can put anything in it.
            address = f"/proc/self/fd/{folder}/{SOCKET_NAME}"
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(SOCKET_NAME, dir_fd=folder, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    raise RegionError(f"{self.path}: a folder, not the lease socket")
                if stat.S_ISSOCK(info.st_mode) and _answers(address):
                    raise RegionError(f"{self.path}: another daemon arbitrates leases here")
                os.unlink(SOCKET_NAME, dir_fd=folder)  # an earlier daemon's, gone
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                listener.bind(address)
                # The folder is this daemon's alone: nothing there to follow.
                os.chmod(SOCKET_NAME, SOCKET_MODE, dir_fd=folder)
                info = os.stat(SOCKET_NAME, dir_fd=folder, follow_symlinks=False)
                self._bound = (info.st_dev, info.st_ino)
                listener.listen(BACKLOG)
            except BaseException:
                listener.close()
                raise
            return listener
        finally:
            os.close(folder)

    def close(self) -> None:
        """Stop arbitrating: every paced process sees its connection end and paces with a lease
        file until a daemon names its arbiter again. The node files keep naming this one."""
        if self._arbiter is not None:
            native_library().vgpu_arbiter_stop(self._arbiter)
            self._arbiter = None
        if self._bound is not None:
            with contextlib.suppress(OSError):
                info = self.path.lstat()
                if (info.st_dev, info.st_ino) == self._bound:  # not a newer daemon's
                    self.path.unlink()
        for device in self._device_leases.values():
            device.close()
        for lease in self._leases:
            lease.close()


def _said(error: Any) -> str:
    text = ffi.string(error)
    return text.decode(errors="replace") if isinstance(text, bytes) else text


def _start_arbiter(
    listener: socket.socket,
    instance: int,
    leases: Sequence[ArbitratedLease],
    devices: Mapping[str, int],
) -> Any:
    library = native_library()
    error = ffi.new("char[]", _ERROR_SIZE)
    arbiter = library.vgpu_arbiter_new(listener.fileno(), instance, error, _ERROR_SIZE)
    if arbiter == ffi.NULL:
        raise RegionError(_said(error))
    try:
        for lease in leases:
            if library.vgpu_arbiter_add_gpu(
                arbiter,
                lease.uuid.encode(),
                lease.fd,
                devices.get(lease.uuid, 0),
                error,
                _ERROR_SIZE,
            ):
                raise RegionError(_said(error))
        if library.vgpu_arbiter_start(arbiter, error, _ERROR_SIZE):
            raise RegionError(_said(error))
    except BaseException:
        library.vgpu_arbiter_stop(arbiter)
        raise
    return arbiter
