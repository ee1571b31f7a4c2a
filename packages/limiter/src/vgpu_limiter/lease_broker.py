"""The node daemon's sealed device leases (vgpu_region.h, ``VGPU_LEASE_SOCKET``).

A lease file under ``{base}/.devices`` is mapped read-write by every paced process, so any of
them could truncate it and kill the others with SIGBUS at their next access. The daemon's lease
cannot be truncated: it is a memfd sealed against shrinking and growing, which the daemon makes
once per GPU and hands to every process that connects to ``{base}/.node/leases.sock`` (the
descriptor travels over the socket; nothing names the memory on disk). Its words are still
written by every paced process, and bounded as for a lease file (docs/security.md).

The daemon never reads from a client: on each connection it sends its one message and closes,
so a client that connects and stays silent, or sends garbage, costs it nothing. The node file
of each GPU names the lease instance handed out now, so that processes holding another (an
earlier daemon's, or a lease file) take this one between two epochs.
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
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from .lease import NODE_FOLDER, NODE_FOLDER_MODE, DeviceLease, folder_fd
from .region import CONSTANTS, RegionError, ffi, normalize_uuid

SOCKET_NAME: Final = "leases.sock"
GREETING: Final = b"vgpu-leases 1\n"
SOCKET_MODE: Final = 0o666  # every paced process of the node shares the leases
_SIZE: Final = ffi.sizeof("struct vgpu_device_lease")
_SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_OFFSETS: Final = {
    field: ffi.offsetof("struct vgpu_device_lease", field) for field in ("magic", "version")
}
ACCEPT_POLL_S: Final = 0.25  # how soon the serving thread sees close()
BACKLOG: Final = 4096  # the kernel caps it (somaxconn): a burst of connections waits its turn
SEND_TIMEOUT_S: Final = 0.2  # a fresh connection takes the small answer at once

log = logging.getLogger(__name__)


class SealedLease:
    """One GPU's lease as a sealed memfd, mapped here; ``instance`` names it (random, not 0)."""

    def __init__(self, uuid: str) -> None:
        self.uuid = normalize_uuid(uuid)
        self.instance = secrets.randbits(63) | 1
        self.fd = os.memfd_create(f"vgpu-lease-{self.uuid}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, _SIZE)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEALS)
            self.mapping = mmap.mmap(self.fd, _SIZE, mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.repair()

    def word(self, offset: int) -> int:
        """The 64-bit word at ``offset`` (it cannot shrink: no SIGBUS to fear here)."""
        return int.from_bytes(self.mapping[offset : offset + 8], sys.byteorder)

    def repair(self) -> bool:
        """Stamp the header again when a sharer scribbled it; whether it had to."""
        magic, version = _OFFSETS["magic"], _OFFSETS["version"]
        good_magic = CONSTANTS["VGPU_LEASE_MAGIC"].to_bytes(8, sys.byteorder)
        good_version = CONSTANTS["VGPU_LEASE_VERSION"].to_bytes(4, sys.byteorder)
        if (
            self.mapping[magic : magic + 8] == good_magic
            and self.mapping[version : version + 4] == good_version
        ):
            return False
        self.mapping[version : version + 4] = good_version
        self.mapping[magic : magic + 8] = good_magic
        return True

    def close(self) -> None:
        self.mapping.close()
        os.close(self.fd)


def _answers(address: str) -> bool:
    """Whether a daemon listens on the socket at ``address`` now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(SEND_TIMEOUT_S)
    try:
        probe.connect(address)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _answer(leases: Sequence[SealedLease]) -> bytes:
    return GREETING + b"".join(f"{lease.uuid} {lease.instance}\n".encode() for lease in leases)


class LeaseBroker:
    """Every GPU's sealed lease, handed out on ``{base}/.node/leases.sock`` by a thread of its
    own, with the GPUs' node files naming them. ``start`` once, ``close`` once."""

    def __init__(self, base: str | os.PathLike[str], uuids: Sequence[str]) -> None:
        self.base = Path(base)
        self._leases = [SealedLease(uuid) for uuid in dict.fromkeys(map(normalize_uuid, uuids))]
        self._device_leases: dict[str, DeviceLease] = {}
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._bound: tuple[int, int] | None = None  # the socket file this broker made
        self.path = self.base / NODE_FOLDER / SOCKET_NAME

    @property
    def uuids(self) -> list[str]:
        return [lease.uuid for lease in self._leases]

    def lease(self, uuid: str) -> SealedLease | None:
        wanted = normalize_uuid(uuid)
        return next((lease for lease in self._leases if lease.uuid == wanted), None)

    def device_lease(self, uuid: str) -> DeviceLease | None:
        """The GPU's DeviceLease (its node file, written here, and the sealed lease's words)."""
        return self._device_leases.get(normalize_uuid(uuid))

    def start(self) -> None:
        """Listen, then name the leases in the node files; RegionError or OSError when the node
        folder or the socket cannot be made, or another daemon hands out leases there."""
        self._socket = self._listen()
        for lease in self._leases:
            device = DeviceLease.open(self.base, lease.uuid, sealed=lease)
            self._device_leases[lease.uuid] = device
        self._thread = threading.Thread(target=self._serve, name="lease broker", daemon=True)
        self._thread.start()

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
                    raise RegionError(f"{self.path}: another daemon hands out leases here")
                os.unlink(SOCKET_NAME, dir_fd=folder)  # an earlier daemon's, gone
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                listener.bind(address)
                # The folder is this daemon's alone: nothing there to follow.
                os.chmod(SOCKET_NAME, SOCKET_MODE, dir_fd=folder)
                info = os.stat(SOCKET_NAME, dir_fd=folder, follow_symlinks=False)
                self._bound = (info.st_dev, info.st_ino)
                listener.listen(BACKLOG)
                listener.settimeout(ACCEPT_POLL_S)
            except BaseException:
                listener.close()
                raise
            return listener
        finally:
            os.close(folder)

    def _serve(self) -> None:
        assert self._socket is not None
        answer = _answer(self._leases)
        fds = [lease.fd for lease in self._leases]
        while not self._closing.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError as error:
                if self._closing.is_set():
                    return
                log.warning("lease socket %s: %s", self.path, error.strerror or error)
                self._closing.wait(ACCEPT_POLL_S)
                continue
            with connection:
                connection.settimeout(SEND_TIMEOUT_S)
                with contextlib.suppress(OSError):
                    socket.send_fds(connection, [answer], fds)

    def repair(self) -> list[str]:
        """Stamp again the headers that sharers scribbled; the GPUs whose lease needed it."""
        return [lease.uuid for lease in self._leases if lease.repair()]

    def close(self) -> None:
        """Stop handing leases out. The node files keep naming them, and processes keep the
        ones they hold: a daemon started again names new ones, which they then take."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * ACCEPT_POLL_S)
        if self._socket is not None:
            self._socket.close()
            with contextlib.suppress(OSError):
                info = self.path.lstat()
                if (info.st_dev, info.st_ino) == self._bound:  # not a newer daemon's
                    self.path.unlink()
        for device in self._device_leases.values():
            device.close()
        for lease in self._leases:
            lease.close()
