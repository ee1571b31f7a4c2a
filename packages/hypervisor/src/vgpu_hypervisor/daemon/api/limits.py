"""Limits on what a client may make the API server hold: body size, read time, connections.

uvicorn covers two of them with its own settings: the size of a request's head
(``h11_max_incomplete_event_size``) and the number of connections and requests at once
(``limit_concurrency``, answered with 503). It has no read timeout: a connection that never
finishes its request's head, or its body, stays open for ever. Two small pieces fill the gaps:
``BodyLimit`` (ASGI) refuses a body over the limit with 413 before reading it all, and
``ReadTimeoutProtocol`` (uvicorn's h11 protocol with a deadline) closes a connection whose
request has not arrived whole within ``REQUEST_READ_TIMEOUT_S`` of its first byte, or of the
connection's opening.
"""

import asyncio
import json
import logging
from typing import Any

import h11
import uvicorn
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("vgpu_hypervisor.api")

MAX_BODY_BYTES = 1 << 20  # the API's documents are a few KiB
MAX_HEAD_BYTES = 64 << 10  # request line and headers
REQUEST_READ_TIMEOUT_S = 10.0  # head and body together
MAX_CONNECTIONS = 256  # beyond this, requests get 503 until connections close
KEEP_ALIVE_S = 5


def too_large_message(limit: int) -> str:
    return f"the request body is larger than the API's limit of {limit} bytes"


class BodyLimit:
    """Refuses a request body over ``max_bytes``: at once when Content-Length says so, else
    as soon as the bytes read pass it (a chunked body), before the app has the whole body."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _send_error(send, 413, too_large_message(self.max_bytes))
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the app's handler: its error handler answers 413, and
                    # the connection closes rather than read the rest of the body.
                    raise HTTPException(
                        413, too_large_message(self.max_bytes), {"Connection": "close"}
                    )
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # h11 has refused it already
    return None


async def _send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ReadTimeoutProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request is still incomplete
    ``REQUEST_READ_TIMEOUT_S`` after its first byte (or after the connection opened).

    Idle time between requests stays uvicorn's keep-alive timeout; this deadline runs only
    while the client owes part of a request (h11's client state IDLE with bytes buffered,
    or SEND_BODY)."""

    read_timeout_s = REQUEST_READ_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._read_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # the request has arrived whole

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            log.info(
                "closed the connection of %s: request incomplete after %g s",
                client,
                self.read_timeout_s,
            )
            self.transport.close()


def server_config(app: ASGIApp) -> uvicorn.Config:
    """uvicorn's settings for the daemon's API, limits included."""
    return uvicorn.Config(
        BodyLimit(app),
        http=ReadTimeoutProtocol,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=KEEP_ALIVE_S,
        log_config=None,
        access_log=False,
        lifespan="off",
    )
