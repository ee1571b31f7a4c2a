"""Helpers of run.sh for its TCP address: is it free (and if not, who holds it), a free port, and
whether a given process is the one listening. Unix-socket addresses always pass (one per path).

    python scripts/tcp_port.py check HOST:PORT     exit 1 with a line naming the holder if busy
    python scripts/tcp_port.py free                a port the kernel has free on 127.0.0.1
    python scripts/tcp_port.py owner HOST:PORT PID exit 1 unless PID listens there
"""

import socket
import sys
from typing import Any

import psutil


def _split(address: str) -> tuple[str, int] | None:
    if address.startswith("unix:"):
        return None
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _listeners(port: int) -> list[Any]:
    try:
        connections = psutil.net_connections(kind="inet")
    except psutil.AccessDenied:
        return []
    return [
        c
        for c in connections
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr[1] == port  # (host, port)
    ]


def _describe(pid: int | None) -> str:
    if pid is None:
        return "a process of another user"
    try:
        process = psutil.Process(pid)
        return f"pid {pid} ({' '.join(process.cmdline())[:120]}, in {process.cwd()})"
    except psutil.Error:
        return f"pid {pid}"


def check(address: str) -> int:
    where = _split(address)
    if where is None:
        return 0
    family = socket.AF_INET6 if ":" in where[0] else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(where)
            return 0
        except OSError as error:
            holders = _listeners(where[1])
            who = ", ".join(_describe(c.pid) for c in holders) or error.strerror
            print(f"error: {address} is held by {who}", file=sys.stderr)
            return 1


def free() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        print(probe.getsockname()[1])
    return 0


def owner(address: str, pid: int) -> int:
    where = _split(address)
    if where is None:
        return 0
    return 0 if any(c.pid == pid for c in _listeners(where[1])) else 1


def main() -> int:
    match sys.argv[1:]:
        case ["check", address]:
            return check(address)
        case ["free"]:
            return free()
        case ["owner", address, pid]:
            return owner(address, int(pid))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
