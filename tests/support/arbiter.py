"""A paced process's side of the daemon's lease arbiter (vgpu_region.h, VGPU_LEASE_SOCKET),
spoken by hand: what any tenant can send, and a way to watch the arbiter from outside."""

import mmap
import os
import socket
from pathlib import Path
from typing import Any

from vgpu_limiter.region import CONSTANTS, ffi

SIM_GPU0 = "GPU-5157a1e0-0000-4000-8000-000000000001"  # the simulator's first GPU
MESSAGE = "struct vgpu_arbiter_message"
MESSAGE_SIZE = ffi.sizeof(MESSAGE)
SEAT = "struct vgpu_lease_seat"
SEAT_SIZE = ffi.sizeof(SEAT)
GRANTED = ffi.offsetof(SEAT, "granted")
ACTIVITY = ffi.offsetof(SEAT, "activity_ns")
OTHER_POD_HOLDS = ffi.offsetof(SEAT, "other_pod_holds")


def _message(kind: str, request: int = 0, value: int = 0, uuid: str = "") -> bytes:
    message: Any = ffi.new(f"{MESSAGE} *")
    message.magic = CONSTANTS["VGPU_ARBITER_MAGIC"]
    message.kind = CONSTANTS[f"VGPU_ARBITER_{kind}"]
    message.request = request
    message.value = value
    message.uuid = uuid.encode()
    return bytes(ffi.buffer(message))


class Client:
    """A process's side of the arbiter, spoken by hand: what any tenant can send."""

    def __init__(self, path: Path, pod: int = 1, uuid: str = SIM_GPU0) -> None:
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.socket.settimeout(10)
        self.socket.connect(str(path))
        self.socket.send(_message("HELLO", value=pod, uuid=uuid))
        data, fds, _, _ = socket.recv_fds(self.socket, MESSAGE_SIZE, 1)
        welcome: Any = ffi.from_buffer(MESSAGE + " *", data)
        assert welcome.kind == CONSTANTS["VGPU_ARBITER_WELCOME"], data
        self.instance = int(welcome.request)
        (self.seat_fd,) = fds
        self.seat = mmap.mmap(self.seat_fd, SEAT_SIZE)

    def word(self, offset: int) -> int:
        return int.from_bytes(self.seat[offset : offset + 8], "little")

    def write(self, offset: int, value: int) -> None:
        self.seat[offset : offset + 8] = value.to_bytes(8, "little")

    def acquire(self, request: int) -> None:
        self.socket.send(_message("ACQUIRE", request))

    def granted(self, request: int, timeout: float) -> bool:
        """Whether a GRANT of ``request`` comes within ``timeout`` seconds."""
        self.socket.settimeout(timeout)
        try:
            while True:
                answer: Any = ffi.from_buffer(MESSAGE + " *", self.socket.recv(MESSAGE_SIZE))
                if answer.kind == CONSTANTS["VGPU_ARBITER_GRANT"] and answer.request == request:
                    return True
        except TimeoutError:
            return False

    def release(self, request: int, busy_ns: int = 0) -> None:
        self.socket.send(_message("RELEASE", request, busy_ns))

    def close(self) -> None:
        self.seat.close()
        os.close(self.seat_fd)
        self.socket.close()
