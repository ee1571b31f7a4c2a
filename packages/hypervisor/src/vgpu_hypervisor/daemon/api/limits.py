"""Limits on what a client may make the API server hold: body size, head size, connections,
time.

uvicorn bounds the size of a request's head itself (``h11_max_incomplete_event_size``).
``BodyLimit`` (ASGI) refuses a body over the limit with 413 before reading it all; the
connections, per client and in all, and the time a request may take to arrive are
connections.py's. uvicorn's own ``limit_concurrency`` stays off: it counts idle connections and
answers 503 to everyone past it, which let clients without a token keep ``/healthz`` down.
"""

import json

import uvicorn
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vgpu_hypervisor.daemon.api.connections import ConnectionLimits, guarded_protocol

MAX_BODY_BYTES = 1 << 20  # the API's documents are a few KiB
MAX_HEAD_BYTES = 64 << 10  # request line and headers
KEEP_ALIVE_S = 5
# Past the head timeout, at stop, the server waits no longer for requests under way.
GRACEFUL_STOP_S = 5


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


def server_config(app: ASGIApp, limits: ConnectionLimits | None = None) -> uvicorn.Config:
    """uvicorn's settings for the daemon's API, limits included."""
    return uvicorn.Config(
        BodyLimit(app),
        http=guarded_protocol(limits or ConnectionLimits()),
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        limit_concurrency=None,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_STOP_S,
        log_config=None,
        access_log=False,
        lifespan="off",
    )
