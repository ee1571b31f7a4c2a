"""Routes that take a body take it as JSON: anything else is a 415 naming what was sent.

FastAPI parses a body without Content-Type as JSON and one of another type as raw bytes, which
then fails validation with a message about dictionaries; `curl -d` sends form encoding by
default. A one-line 415 saying what to send is the clearer answer to both. The check sits in
the route (after routing), so an unknown path or method stays a 404 or 405.

The body is then read here, as JSON in UTF-8 (RFC 8259), before FastAPI reads it: a body that
is not is a 422 naming why. FastAPI answered a number of 5000 digits, 100000 nested arrays and
bytes that are not UTF-8 with a 400 "There was an error parsing the body" that named nothing
(and is in no OpenAPI answer), and took UTF-16, which its json.loads guesses from the bytes.
"""

import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from vgpu_hypervisor.daemon.api.errors import ApiError, not_json


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


def body_problem(body: bytes) -> str | None:
    """Why ``body`` is no JSON the API takes, in one line; None when it is one (or is empty:
    the route then names the body missing). A key an object gives twice is refused too: json
    keeps the last one, and a GPU given twice in a pod's limits lost its first limit without a
    word."""
    if not body:
        return None
    try:
        # A byte order mark may come first (RFC 8259 8.1); no other encoding than UTF-8.
        json.loads(body.decode("utf-8-sig"), object_pairs_hook=_no_repeats)
    except _Repeated as repeated:
        return f"the JSON body gives the key {repeated.args[0]!r} twice in one object"
    except UnicodeDecodeError as error:
        why = f"not UTF-8 (byte 0x{body[error.start]:02x} at offset {error.start})"
    except json.JSONDecodeError as error:
        why = error.msg  # as FastAPI's own parsing words it
    except RecursionError:
        why = "nested too deeply"
    except ValueError:  # int() past its digits: the one other ValueError json raises
        why = f"a number of more than {sys.get_int_max_str_digits()} digits"
    else:
        return None
    return not_json(why)


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
            wrong = body_problem(await request.body())  # read once: the handler's too
            if wrong is not None:
                raise ApiError(422, wrong)
            return await handler(request)

        return json_only
