"""Every API error is a JSON ``{"error": "one line"}`` with a 4xx status naming the problem; a
500 means a bug, and is logged with its traceback.

A pod's region is its tenant's file: the tenant may truncate, rewrite or remove it at any
moment, also between the daemon's check of it and its change. Whatever region call raises
RegionError, the answer is the 409 an unreadable region gets, never a 500."""

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from vgpu_common.visible import visible
from vgpu_limiter.region import RegionError

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.pods import PodConflict, PodError, PodNotFound

log = logging.getLogger("vgpu_hypervisor.api")

_WHY = {
    401: "The API token is missing or wrong.",
    404: "No such pod.",
    409: "The pod exists already, its workers are alive, or its region cannot be used.",
    415: "The body is not sent as JSON.",
    422: "A parameter or the body is not valid.",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error documents a route may answer, for its OpenAPI description (only those it can:
    a 422 listed here also replaces FastAPI's own schema of it, which is not what we send)."""
    return {code: {"model": models.ErrorDocument, "description": _WHY[code]} for code in codes}


def _pod_status(error: PodError) -> int:
    """The HTTP status of a store's refusal: the domain names what went wrong, the API how it
    answers it."""
    if isinstance(error, PodNotFound):
        return 404
    if isinstance(error, PodConflict):
        return 409
    return 422


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _validation_message(error: RequestValidationError) -> str:
    problems = error.errors()
    if not problems:
        return "invalid request"
    first = problems[0]
    if first.get("type") == "json_invalid":
        return not_json(first.get("ctx", {}).get("error", "parse error"))
    return models.first_problem(problems, "body")


def not_json(why: str) -> str:
    """The error of a body that is no JSON the API reads, ``why`` in words."""
    return f"the body is not valid JSON: {why}"


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    # One line of visible text whatever the request held: a query parameter named with a
    # newline was named back with it (found by fuzzing), and what the CLI prints comes from here.
    body = {"error": visible(message)}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return _error(422, _validation_message(error))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        message = error.detail if isinstance(error.detail, str) else str(error.detail)
        if error.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif error.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        return _error(error.status_code, message, error.headers)

    @app.exception_handler(PodError)
    async def pod_error(request: Request, error: PodError) -> JSONResponse:
        return _error(_pod_status(error), str(error))

    @app.exception_handler(RegionError)
    async def region_error(request: Request, error: RegionError) -> JSONResponse:
        # The message names the file and what is wrong with it; one line whatever it holds.
        message = " ".join(str(error).split()) or type(error).__name__
        log.info("%s %s: region error: %s", request.method, request.url.path, message)
        return _error(409, f"the pod's region cannot be used: {message}")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return _error(error.status, str(error))

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return _error(500, f"internal error: {type(error).__name__}")
