"""Reading a small file an admin names (a config file, an API token): a regular file of at most
a few kilobytes to a megabyte, read without blocking on what is not one (a FIFO, /dev/zero, a
terminal), each problem one line."""

import os
import re
import stat
from pathlib import Path
from typing import Final

TOKEN_LIMIT: Final = 4096
_TOKEN = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no blanks: what an HTTP header carries


class SmallFileError(Exception):
    """The file cannot be used as it is: the message says why, without naming the file."""


def read_small_file(path: Path, limit: int) -> bytes:
    """The bytes of ``path``; OSError as open(2) gives it (FileNotFoundError, IsADirectoryError,
    PermissionError, …), SmallFileError when it is not a regular file or holds more than
    ``limit`` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        if not stat.S_ISREG(info.st_mode):
            raise SmallFileError("not a regular file")
        chunks = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise SmallFileError(f"larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def token_of(data: bytes) -> str:
    """The token a token file holds (blanks around it dropped); SmallFileError when it holds
    none, or anything but one word of printable ASCII."""
    text = data.strip()
    if not text:
        raise SmallFileError("empty")
    try:
        token = text.decode("ascii")
    except UnicodeDecodeError:
        raise SmallFileError("not a token: only printable ASCII without blanks is") from None
    if not _TOKEN.fullmatch(token):
        raise SmallFileError("not a token: only printable ASCII without blanks is")
    return token
