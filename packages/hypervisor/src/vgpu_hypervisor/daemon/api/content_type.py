"""Requests with a body must say it is JSON: anything else is a 415 naming what was sent.

FastAPI parses a body without Content-Type as JSON and one of another type as raw bytes, which
then fails validation with a message about dictionaries; `curl -d` sends form encoding by
default. A one-line 415 saying what to send is the clearer answer to both.
"""

import json

from starlette.types import ASGIApp, Receive, Scope, Send

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


def is_json(content_type: str) -> bool:
    """application/json or application/*+json, parameters (charset) allowed."""
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def problem(content_type: str | None) -> str:
    sent = "no Content-Type" if not content_type else f"Content-Type {content_type!r}"
    return (
        f"the request body must be JSON, sent with Content-Type: application/json (got {sent}; "
        "curl: --json or -H 'Content-Type: application/json')"
    )


class RequireJson:
    """ASGI middleware: 415 for a POST, PUT or PATCH whose Content-Type is not JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _WITH_BODY:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        raw = headers.get(b"content-type")
        content_type = raw.decode("latin-1") if raw is not None else None
        if content_type is not None and is_json(content_type):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": problem(content_type)}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 415,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
