"""A JSON file only the daemon writes or reads, in a folder of its own under the base path: what
the daemon must remember across its restarts and no tenant may write (the pod source's book, the
class and weight the daemon holds for each pod).

The folder is made 0700 and checked at every open to be the daemon's own and closed to others
(a folder someone else made there is refused); the file is opened without following links or
blocking, read only if it is a regular file of a sane size, and written whole, through a new
file renamed over the old. No container mounts these folders.
"""

import errno
import fcntl
import json
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

log = logging.getLogger("vgpu_hypervisor")
_MOST_BYTES: Final = 16 << 20  # far above what a node's pods take; a bigger file is not ours
_DIRECTORY: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class PrivateFolderError(Exception):
    """The folder is not the daemon's own; one line."""


class LockHeld(PrivateFolderError):
    """Another process holds the lock file; ``holder`` is the pid it wrote there, if any."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class PrivateFile:
    """``{folder}/{name}``: ``load`` once, ``save`` after each change."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
        self.path = folder / name

    def check(self) -> None:
        """Make the folder when missing; PrivateFolderError when it is not the daemon's own."""
        os.close(self._open_folder())

    def _open_folder(self) -> int:
        try:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            self.folder.mkdir(0o700, exist_ok=True)
            fd = os.open(self.folder, _DIRECTORY)
        except OSError as error:
            why = (
                "not a folder (a symbolic link?)"
                if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST)
                else error.strerror
            )
            raise PrivateFolderError(f"{self.folder}: {why}") from None
        info = os.fstat(fd)
        problem = (
            f"owned by uid {info.st_uid}, not the daemon's"
            if info.st_uid != os.geteuid()
            else "open to other users"
            if info.st_mode & 0o077
            else None
        )
        if problem is not None:
            os.close(fd)
            raise PrivateFolderError(
                f"{self.folder}: {problem}: not the daemon's own folder (remove it)"
            )
        return fd

    def lock(self) -> int:
        """The file (made when missing) locked for this process alone, its descriptor to keep
        open while the lock is to hold; the kernel lets go of it when the process ends, however
        it ends (SIGKILL included), so no stale lock outlives a daemon. The holder's pid is
        written into the file, for the message of the next one that tries. LockHeld when another
        process holds it; PrivateFolderError when the folder or the file is not the daemon's."""
        folder = self._open_folder()
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(self.name, flags, 0o600, dir_fd=folder)
        except OSError as error:
            raise PrivateFolderError(f"{self.path}: {error.strerror}") from None
        finally:
            os.close(folder)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PrivateFolderError(f"{self.path}: not a regular file (remove it)")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                raise LockHeld(f"{self.path}: held by another process", holder) from None
            with suppress(OSError):  # the pid is only for the message: a full disk is no matter
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def load(self) -> Any:
        """The file's JSON, or None when there is none or it cannot be read (said once)."""
        try:
            folder = self._open_folder()
        except PrivateFolderError as error:
            log.warning("%s; starting afresh", error)
            return None
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=folder)  # fmt: skip
        except FileNotFoundError:
            return None
        except OSError as error:
            log.warning("%s: cannot read: %s; starting afresh", self.path, error)
            return None
        finally:
            os.close(folder)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MOST_BYTES:
                raise ValueError("not a file the daemon wrote")
            with os.fdopen(fd, "rb") as file:
                fd = -1
                document = json.loads(file.read(_MOST_BYTES))
            if document is None:  # never written so: a damaged file, not a missing one
                raise ValueError("null, not a document the daemon writes")
            return document
        except (OSError, ValueError) as error:
            log.warning("%s: cannot read: %s; starting afresh", self.path, error)
            return None
        finally:
            if fd >= 0:
                os.close(fd)

    def save(self, data: Any) -> None:
        """The whole file written anew; an error is logged (the caller keeps its memory)."""
        encoded = json.dumps(data, separators=(",", ":")).encode()
        new = f".{self.name}.new"
        try:
            folder = self._open_folder()
        except PrivateFolderError as error:
            log.error("%s; kept in memory only", error)
            return
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(new, flags, 0o600, dir_fd=folder)
            try:
                _write_all(fd, encoded)
            finally:
                os.close(fd)
            os.replace(new, self.name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as error:
            log.error("%s: cannot write: %s", self.path, error.strerror or error)
            with suppress(OSError):
                os.unlink(new, dir_fd=folder)
        finally:
            os.close(folder)


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data``, or OSError. One write(2) on a file system about to fill writes what
    fits and says how much without an error: the file renamed over the old one was cut short,
    and the next daemon found it unreadable and started afresh (ENOSPC comes from the write
    after it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def pod_entries(document: Any) -> Iterator[tuple[tuple[str, str], tuple[int, int], Any]]:
    """The entries of a file that holds one per pod (``{"namespace", "name", "region":
    [st_dev, st_ino], ...}``), each with its pod and its region file's identity; TypeError,
    KeyError or ValueError at the first of the wrong shape."""
    for entry in document:
        namespace, name = entry["namespace"], entry["name"]
        if not isinstance(namespace, str) or not isinstance(name, str):
            raise TypeError("a name that is not a string")
        device, inode = entry["region"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (device, inode)):
            raise TypeError("a region identity that is not two whole numbers")
        yield (namespace, name), (device, inode), entry
