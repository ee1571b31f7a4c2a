"""What connections a client can make the API server hold, and for how long.

uvicorn's own limit (``limit_concurrency``) counts open connections, idle ones included, and
answers 503 to every request past it: 256 connections that never send a request (any local
user, no token needed) kept ``/healthz`` and token-holding clients at 503 for as long as they
stayed open. So the daemon runs uvicorn without it and with this protocol instead (uvicorn's
h11 protocol, subclassed: its version is bounded in the package's setup.py), which never
refuses a new connection because of old idle ones:

- Each client (its user on this host, else its address: peers.py) holds at most
  ``per_client`` connections. Past that, the client's oldest *waiting* connection is closed: one
  whose request has not arrived whole, or kept alive between requests; one with no bytes in
  its socket that the server has yet to read first (a request just sent is not thrown away
  because the server had not read it yet). A new connection is closed at once only when all
  the client's others are busy with requests.
- Past ``total`` connections, the oldest waiting connection of the client holding the most is
  closed, so a client alone cannot push others out.
- A request's head must arrive within ``head_timeout_s`` of its first byte (or of the
  connection's opening), the whole request within ``request_timeout_s``; idle time between
  requests stays uvicorn's keep-alive timeout.
- A reply the client does not read (the transport's buffer full) is given ``write_stall_s``.

So a client that has sent its request is served whatever others hold open, and a flood of idle
connections costs the server at most ``total`` sockets for a few seconds each.
"""

import asyncio
import fcntl
import logging
import sys
import termios
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from vgpu_hypervisor.daemon.api.peers import client_of

log = logging.getLogger("vgpu_hypervisor.api")
# A line a minute per client and kind of event: a flood of connections is not a flood of lines.
REPORT_EVERY_S = 60.0


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits (module docstring). Not settings: a node's admin has no reason to move them,
    and each is far from what a legitimate client needs (the CLI and top hold one connection,
    a probe one for a moment)."""

    per_client: int = 32
    total: int = 256
    head_timeout_s: float = 5.0
    request_timeout_s: float = 10.0
    write_stall_s: float = 30.0


class Clients:
    """The server's open connections by client, each group oldest first."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._groups: dict[str, dict[GuardedProtocol, None]] = {}
        self._count = 0
        # (client, kind) -> when last logged, and how many since were not.
        self._reported: dict[tuple[str, str], tuple[float, int]] = {}

    def add(self, connection: "GuardedProtocol") -> None:
        group = self._groups.setdefault(connection.client_key, {})
        group[connection] = None
        self._count += 1
        if len(group) > self.limits.per_client:
            self._shed([group], connection, f"more than {self.limits.per_client} connections")
        if self._count > self.limits.total:
            largest_first = sorted(self._groups.values(), key=len, reverse=True)
            why = f"the server holds {self.limits.total} connections"
            self._shed(largest_first, connection, why, busy_too=True)

    def discard(self, connection: "GuardedProtocol") -> None:
        group = self._groups.get(connection.client_key)
        if group is None or connection not in group:
            return
        del group[connection]
        self._count -= 1
        if not group:
            del self._groups[connection.client_key]

    def _shed(
        self,
        groups: list[dict["GuardedProtocol", None]],
        newcomer: "GuardedProtocol",
        why: str,
        *,
        busy_too: bool = False,
    ) -> None:
        """Close, in the first group that has one, the oldest waiting connection with nothing
        unread; else the oldest waiting one. When none waits: with ``busy_too`` (the server's
        total) the oldest of the first group's others, busy or not, so that a few clients whose
        replies stall cannot shut every newcomer out (a liveness probe included); else the
        newcomer. (Bytes a burst of new connections sent may lie unread for a moment, requests
        and scraps alike: they are a preference, and the newcomer, likely to be about to send
        its request, is never closed for an older one that waits.)"""
        others = [c for group in groups for c in group if c is not newcomer and c.waiting]
        busy = [c for group in groups[:1] for c in group if c is not newcomer] if busy_too else []
        fallback = others[0] if others else busy[0] if busy else newcomer
        victim = next((c for c in others if not c.unread()), fallback)
        self.report(
            victim.client_key,
            f"{why}: closing its oldest connections that have no request under way",
            logging.WARNING,
        )
        self.discard(victim)
        victim.close(f"closed to make room: {why}")

    def report(self, client: str, what: str, level: int = logging.INFO) -> None:
        """Log ``what`` of ``client``, at most once a minute per client and kind of event,
        saying how many such events went unlogged since."""
        now = time.monotonic()
        key = (client, what)
        last, unlogged = self._reported.get(key, (-REPORT_EVERY_S, 0))
        if now - last < REPORT_EVERY_S:
            self._reported[key] = (last, unlogged + 1)
            return
        if len(self._reported) > 4096:  # many clients come and go: keep only the current
            self._reported = {
                k: v for k, v in self._reported.items() if now - v[0] < REPORT_EVERY_S
            }
        self._reported[key] = (now, 0)
        since = f" ({unlogged} more since the last such line)" if unlogged else ""
        log.log(level, "API client %s: %s%s", client, what, since)


class GuardedProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol under the limits of ``clients`` (see the module)."""

    clients: ClassVar[Clients]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.client_key = "unknown"
        self._deadline: asyncio.TimerHandle | None = None
        self._request_started = 0.0
        self._stall: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> bool:
        """No request is being answered: the client owes the request (or part of it), or
        the connection is kept alive between requests."""
        return self.conn.their_state in (h11.IDLE, h11.SEND_BODY)

    def unread(self) -> bool:
        """Bytes wait in the socket that the server has not read (FIONREAD)."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            count = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(count, sys.byteorder) > 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.client_key = client_of(transport)
        self._request_begins()
        self.clients.add(self)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._request_begins()  # the first byte of the next request on a kept-alive one
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY and self._deadline is not None:
            # The head is in: the body has what is left of the request's time.
            self._set_deadline(self._request_started + self.clients.limits.request_timeout_s)
        elif state is not h11.IDLE:
            self._cancel_deadline()  # the request has arrived whole

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self._cancel_stall()
        self.clients.discard(self)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(
                self.clients.limits.write_stall_s, self._reply_stalled
            )

    def resume_writing(self) -> None:
        self._cancel_stall()
        super().resume_writing()

    def close(self, why: str) -> None:
        """Close the connection now: nothing is owed to this client."""
        self._cancel_deadline()
        self._cancel_stall()
        self.clients.discard(self)
        if not self.transport.is_closing():
            log.debug("API client %s (%s): %s", self.client_key, self._peer(), why)
            # abort, not close: a reply nobody reads would keep the socket open otherwise.
            self.transport.abort()

    def _request_begins(self) -> None:
        self._request_started = self.loop.time()
        self._set_deadline(self._request_started + self.clients.limits.head_timeout_s)

    def _set_deadline(self, when: float) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_at(when, self._request_timed_out)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _cancel_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _request_timed_out(self) -> None:
        self._deadline = None
        if self.waiting and not self.transport.is_closing():
            limits = self.clients.limits
            if self.conn.their_state is h11.IDLE:
                what = f"request head incomplete after {limits.head_timeout_s:g} s"
            else:
                what = f"request incomplete after {limits.request_timeout_s:g} s"
            self.clients.report(self.client_key, f"connection closed: {what}")
            self.close(what)

    def _reply_stalled(self) -> None:
        self._stall = None
        if not self.transport.is_closing():
            what = f"reply unread for {self.clients.limits.write_stall_s:g} s"
            self.clients.report(self.client_key, f"connection closed: {what}")
            self.close(what)

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a unix socket"


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """A protocol class whose connections share one set of ``limits`` (one per server)."""
    return type("Guarded", (GuardedProtocol,), {"clients": Clients(limits)})
