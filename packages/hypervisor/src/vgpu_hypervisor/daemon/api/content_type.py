"""Routes that take a body take it as JSON: anything else is a 415 naming what was sent.

FastAPI parses a body without Content-Type as JSON and one of another type as raw bytes, which
then fails validation with a message about dictionaries; `curl -d` sends form encoding by
default. A one-line 415 saying what to send is the clearer answer to both. The check sits in
the route (after routing), so an unknown path or method stays a 404 or 405.
"""

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from vgpu_hypervisor.daemon.api.errors import ApiError


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


class JsonBodyRoute(APIRoute):
    """An APIRoute that answers 415 before reading a body that is not declared JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def json_only(request: Request) -> Response:
            content_type = request.headers.get("content-type")
            if content_type is None or not is_json(content_type):
                raise ApiError(415, problem(content_type))
            return await handler(request)

        return json_only
