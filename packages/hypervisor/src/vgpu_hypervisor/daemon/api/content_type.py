"""Routes that take a body take it as JSON: anything else is a 415 naming what was sent.

FastAPI parses a body without Content-Type as JSON and one of another type as raw bytes, which
then fails validation with a message about dictionaries; `curl -d` sends form encoding by
default. A one-line 415 saying what to send is the clearer answer to both. The check sits in
the route (after routing), so an unknown path or method stays a 404 or 405.
"""

import json
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


class _Repeated(Exception):
    pass


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Repeated(key)
        seen[key] = value
    return seen


def repeated_key(body: bytes) -> str | None:
    """A key an object of the JSON ``body`` gives twice (json keeps the last one: a GPU given
    twice in a pod's limits lost its first limit without a word); None when none is, or when
    the body is no JSON (the route's own parsing says so)."""
    try:
        json.loads(body, object_pairs_hook=_no_repeats)
    except _Repeated as repeated:
        return str(repeated.args[0])
    except (ValueError, RecursionError):
        return None
    return None


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
            repeated = repeated_key(await request.body())  # read once: the handler's too
            if repeated is not None:
                raise ApiError(422, f"the JSON body gives the key {repeated!r} twice in one object")
            return await handler(request)

        return json_only
