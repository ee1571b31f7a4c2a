"""The node-wide device lease files from Python (vgpu_region.h, ``struct vgpu_device_lease``).

``{base}/.devices/{uuid}``: one per GPU, mapped by every limited process that paces work on
it. The compute limiter owns the lease words; the node daemon writes only the boost (how much
faster than at its power limit the GPU runs its work now), which the limiter multiplies the
GPU time it charges by. Files are made as the limiter makes them: the folder sticky and open to
all (pods run as other users), the file 0o666, all zeros but for magic and version.
"""

from __future__ import annotations

import math
import mmap
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from .region import CONSTANTS, RegionError, ffi, normalize_uuid

LEASE_FOLDER: Final = ".devices"
BOOST_ONE: Final = CONSTANTS["VGPU_BOOST_ONE"]
BOOST_MAX: Final = CONSTANTS["VGPU_BOOST_MAX"]
_SIZE: Final = ffi.sizeof("struct vgpu_device_lease")


def lease_path(base: str | os.PathLike[str], uuid: str) -> Path:
    return Path(base) / LEASE_FOLDER / normalize_uuid(uuid)


class DeviceLease:
    """One GPU's lease file, mapped read-write. ``with DeviceLease.open(base, uuid) as lease:``"""

    def __init__(self, path: Path, mapping: mmap.mmap) -> None:
        self.path = path
        self._mapping = mapping
        self._buffer = ffi.from_buffer(mapping)
        self._lease: Any = ffi.cast("struct vgpu_device_lease *", self._buffer)

    @classmethod
    def open(cls, base: str | os.PathLike[str], uuid: str) -> DeviceLease:
        """Map the GPU's lease, creating it (and its folder) when missing; RegionError when the
        file cannot be made or is not a lease of this version."""
        path = lease_path(base, uuid)
        try:
            if not path.parent.is_dir():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.parent.chmod(0o1777)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as error:
            raise RegionError(f"{path}: cannot open the device lease: {error.strerror}") from None
        try:
            os.fchmod(fd, 0o666)
            if os.fstat(fd).st_size < _SIZE:  # new: zeros are a free lease; never shrunk
                os.ftruncate(fd, _SIZE)
            mapping = mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as error:
            raise RegionError(f"{path}: cannot map the device lease: {error.strerror}") from None
        finally:
            os.close(fd)
        lease = cls(path, mapping)
        header = lease._lease
        if header.magic == 0:
            header.version = CONSTANTS["VGPU_LEASE_VERSION"]
            header.magic = CONSTANTS["VGPU_LEASE_MAGIC"]
        if header.magic != CONSTANTS["VGPU_LEASE_MAGIC"] or (
            header.version != CONSTANTS["VGPU_LEASE_VERSION"]
        ):
            lease.close()
            raise RegionError(
                f"{path}: not a device lease of version {CONSTANTS['VGPU_LEASE_VERSION']}"
            )
        return lease

    def publish_boost(self, boost: float) -> int:
        """Publish the GPU's boost factor (>= 1; clamped to the limiter's range); the stored
        value, in parts per BOOST_ONE. The time is written last: a reader that sees it fresh
        sees a value written by this daemon."""
        if not math.isfinite(boost):
            raise ValueError(f"boost must be a finite number, not {boost!r}")
        parts = min(BOOST_MAX, max(BOOST_ONE, round(boost * BOOST_ONE)))
        self._lease.boost = parts
        self._lease.boost_ns = time.monotonic_ns()
        return int(parts)

    def boost(self) -> float | None:
        """The published boost, or None when none is published or it is stale (as the
        limiter judges it)."""
        parts, written = int(self._lease.boost), int(self._lease.boost_ns)
        now = time.monotonic_ns()
        if parts == 0 or written > now or now - written > CONSTANTS["VGPU_BOOST_STALE_NS"]:
            return None
        return min(BOOST_MAX, max(BOOST_ONE, parts)) / BOOST_ONE

    def active_within(self, seconds: float) -> bool:
        """Whether a limited process ran an epoch on the GPU in the last ``seconds``."""
        activity = int(self._lease.activity_ns)
        return activity != 0 and time.monotonic_ns() - activity <= seconds * 1e9

    def withdraw_boost(self) -> None:
        """Stop correcting: the limiter charges plain GPU time again."""
        self._lease.boost = 0

    def close(self) -> None:
        """Unmap; later calls do nothing."""
        if self._lease is not None:
            self._lease = None
            ffi.release(self._buffer)  # a mapping with views left cannot be closed
            self._mapping.close()

    def __enter__(self) -> DeviceLease:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
