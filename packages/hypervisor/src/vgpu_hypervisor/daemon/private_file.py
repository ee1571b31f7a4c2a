"""A JSON file only the daemon writes or reads, in a folder of its own under the base path: what
the daemon must remember across its restarts and no tenant may write (the pod source's book, the
class and weight the daemon holds for each pod).

The folder is made 0700 and checked at every open to be the daemon's own and closed to others
(a folder someone else made there is refused); the file is opened without following links or
blocking, read only if it is a regular file of a sane size, and written whole, through a new
file renamed over the old. No container mounts these folders.
"""

import errno
import json
import logging
import os
import stat
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

log = logging.getLogger("vgpu_hypervisor")
_MOST_BYTES: Final = 16 << 20  # far above what a node's pods take; a bigger file is not ours
_DIRECTORY: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class PrivateFolderError(Exception):
    """The folder is not the daemon's own; one line."""


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
                if error.errno in (errno.ELOOP, errno.ENOTDIR)
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
                return json.loads(file.read(_MOST_BYTES))
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
                os.write(fd, encoded)
            finally:
                os.close(fd)
            os.replace(new, self.name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as error:
            log.error("%s: cannot write: %s", self.path, error.strerror or error)
            with suppress(OSError):
                os.unlink(new, dir_fd=folder)
        finally:
            os.close(folder)
