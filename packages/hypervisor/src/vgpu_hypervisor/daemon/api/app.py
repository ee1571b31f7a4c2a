"""The daemon's HTTP API (FastAPI): health, readiness, GPUs, pods, workers, status, /metrics.

Reads are served from the newest NodeView (no file or driver access on a request); changes go
to the region files in a worker thread and are followed by a fresh view, so a reply shows what
it did. Changes need the bearer token. Every error is a JSON ``{"error": "one line"}`` with a 4xx
status naming the problem; a 500 means a bug, and is logged with its traceback.
"""

import asyncio
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException
from vgpu_limiter.region import normalize_uuid

from vgpu_hypervisor import models
from vgpu_hypervisor.gpu import BackendInfo
from vgpu_hypervisor.metrics import exposition, prometheus_registry
from vgpu_hypervisor.node import Node, NodeView
from vgpu_hypervisor.pods import Limits, PodError, PodNotFound

log = logging.getLogger("vgpu_hypervisor.api")
API = "/api/v1"
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ApiContext:
    """What the API needs from the daemon."""

    node: Node
    backend: BackendInfo
    token: str
    version: str
    shm_base_path: Path
    started: float
    # The daemon's tasks are running (readiness); set by the daemon.
    running: Callable[[], bool] = lambda: True


# --- errors -------------------------------------------------------------------------------


def _location(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if part not in ("body",)) or "body"


def _validation_message(error: RequestValidationError) -> str:
    problems = error.errors()
    if not problems:
        return "invalid request"
    first = problems[0]
    where = _location(tuple(first.get("loc", ())))
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}"
    message = " ".join(str(first.get("msg", "invalid")).removeprefix("Value error, ").split())
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    return f"{where}: {message}{more}"


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers or {}))


def _install_error_handlers(app: FastAPI) -> None:
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
        return _error(error.status, str(error))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return _error(error.status, str(error))

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return _error(500, f"internal error: {type(error).__name__}")


# --- helpers ------------------------------------------------------------------------------

NameParam = Annotated[str, PathParam(pattern=models.NAME_PATTERN, max_length=253)]
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": models.ErrorDocument} for code in (401, 404, 409, 422)
}


def resolve_gpus(view: NodeView, gpus: Mapping[str, models.GpuLimitsRequest]) -> dict[str, Limits]:
    """Limits by GPU UUID from limits by index or UUID, checked against this node's GPUs."""
    by_index = {gpu.index: gpu for gpu in view.gpus}
    by_uuid = {gpu.uuid.lower(): gpu for gpu in view.gpus if gpu.uuid}
    resolved: dict[str, Limits] = {}
    for key, wanted in gpus.items():
        gpu = by_uuid.get(key.lower()) if key.upper().startswith("GPU-") else None
        if not key.upper().startswith("GPU-"):
            gpu = by_index.get(int(key))
        if gpu is None or gpu.uuid is None:
            count = len(view.gpus)
            raise ApiError(422, f"gpus.{key}: no such GPU on this node ({count} GPU(s))")
        uuid = normalize_uuid(gpu.uuid)
        if uuid in resolved:
            raise ApiError(422, f"gpus.{key}: GPU {uuid} is given twice")
        if wanted.memory and gpu.memory_total and wanted.memory > gpu.memory_total:
            raise ApiError(
                422,
                f"gpus.{key}: memory limit {wanted.memory} bytes is more than the GPU's "
                f"{gpu.memory_total}",
            )
        resolved[uuid] = Limits(memory=wanted.memory, compute=wanted.compute)
    return resolved


def read_or_create_token(path: Path) -> str:
    """The API token in ``path``, created (mode 0600, folder included) when absent."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd, temporary = tempfile.mkstemp(prefix=".token-", dir=path.parent)
    try:
        os.write(fd, (token + "\n").encode())
        os.close(fd)
        Path(temporary).replace(path)  # mkstemp made it 0600
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return token


# --- the app ------------------------------------------------------------------------------


def create_app(context: ApiContext) -> FastAPI:
    app = FastAPI(
        title="tf-hypervisor",
        version=context.version,
        description="The vgpu node daemon: GPUs, pods with memory and compute limits, workers.",
        responses={422: {"model": models.ErrorDocument}},
    )
    _install_error_handlers(app)
    bearer = HTTPBearer(auto_error=False, description="The token in the daemon's token file.")
    registry = prometheus_registry(lambda: context.node.view)
    changes = asyncio.Lock()

    def authorized(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        challenge = {"WWW-Authenticate": "Bearer"}
        if credentials is None:
            raise HTTPException(401, "this request needs the API token (Bearer)", challenge)
        if not secrets.compare_digest(credentials.credentials.encode(), context.token.encode()):
            raise HTTPException(401, "wrong API token", challenge)

    async def change(action: Callable[[], Any]) -> Any:
        async with changes:
            result = await asyncio.to_thread(action)
            await asyncio.to_thread(context.node.refresh)
            return result

    def found(namespace: str, name: str) -> models.Pod:
        pod = context.node.view.pod(namespace, name)
        if pod is None:
            raise PodNotFound(f"no pod {namespace}/{name}")
        return pod

    @app.get("/healthz", response_model=models.Health, tags=["health"])
    async def health() -> models.Health:
        """The daemon answers."""
        return models.Health(status="ok")

    @app.get(
        "/readyz",
        response_model=models.Readiness,
        responses={503: {"model": models.Readiness}},
        tags=["health"],
    )
    async def ready() -> Any:
        """NVML answered and the base path is writable."""
        checks = readiness(context)
        document = models.Readiness(ready=all(v == "ok" for v in checks.values()), checks=checks)
        if document.ready:
            return document
        return JSONResponse(document.model_dump(), status_code=503)

    @app.get(f"{API}/status", response_model=models.Status, tags=["node"])
    async def status() -> models.Status:
        view = context.node.view
        return models.Status(
            version=context.version,
            backend=context.backend.backend,
            backend_description=context.backend.describe(),
            started=context.started,
            uptime_s=round(time.time() - context.started, 3),
            shm_base_path=str(context.shm_base_path),
            gpus=len(view.gpus),
            pods=len(view.pods),
            pods_with_errors=sum(1 for pod in view.pods if pod.error),
            workers=len(view.workers),
            last_sample=view.snapshot.taken_at if view.snapshot else None,
            ready=all(v == "ok" for v in readiness(context).values()),
        )

    @app.get(f"{API}/gpus", response_model=list[models.Gpu], tags=["node"])
    async def gpus() -> list[models.Gpu]:
        return list(context.node.view.gpus)

    @app.get(f"{API}/pods", response_model=list[models.Pod], tags=["pods"])
    async def pods(
        namespace: Annotated[str | None, Query(pattern=models.NAME_PATTERN)] = None,
    ) -> list[models.Pod]:
        return [p for p in context.node.view.pods if namespace in (None, p.namespace)]

    @app.post(
        f"{API}/pods",
        response_model=models.Pod,
        status_code=201,
        responses=ERRORS,
        dependencies=[Depends(authorized)],
        tags=["pods"],
    )
    async def create_pod(request: models.PodCreate) -> models.Pod:
        """Create a pod's region with limits per GPU (by index or UUID)."""
        limits = resolve_gpus(context.node.view, request.gpus)
        await change(lambda: context.node.store.create(request.namespace, request.name, limits))
        log.info("pod %s/%s created: %s", request.namespace, request.name, _limits_text(limits))
        return found(request.namespace, request.name)

    @app.get(
        f"{API}/pods/{{namespace}}/{{name}}",
        response_model=models.Pod,
        responses=ERRORS,
        tags=["pods"],
    )
    async def get_pod(namespace: NameParam, name: NameParam) -> models.Pod:
        return found(namespace, name)

    @app.patch(
        f"{API}/pods/{{namespace}}/{{name}}",
        response_model=models.Pod,
        responses=ERRORS,
        dependencies=[Depends(authorized)],
        tags=["pods"],
    )
    async def update_pod(
        namespace: NameParam, name: NameParam, request: models.PodUpdate
    ) -> models.Pod:
        """Change limits live: running workers see them within a second."""
        limits = resolve_gpus(context.node.view, request.gpus)
        await change(lambda: context.node.store.update(namespace, name, limits))
        log.info("pod %s/%s updated: %s", namespace, name, _limits_text(limits))
        return found(namespace, name)

    @app.delete(
        f"{API}/pods/{{namespace}}/{{name}}",
        response_model=models.Pod,
        responses=ERRORS,
        dependencies=[Depends(authorized)],
        tags=["pods"],
    )
    async def delete_pod(
        namespace: NameParam,
        name: NameParam,
        force: Annotated[bool, Query(description="Delete even with live workers.")] = False,
    ) -> models.Pod:
        """Remove a pod's region; refused (409) while its workers live, unless force."""
        pod = found(namespace, name)
        await change(lambda: context.node.store.delete(namespace, name, force=force))
        log.info("pod %s/%s deleted%s", namespace, name, " (forced)" if force else "")
        return pod

    @app.get(f"{API}/workers", response_model=list[models.Worker], tags=["workers"])
    async def workers(
        namespace: Annotated[str | None, Query(pattern=models.NAME_PATTERN)] = None,
        pod: Annotated[str | None, Query(pattern=models.NAME_PATTERN)] = None,
    ) -> list[models.Worker]:
        return [
            w
            for w in context.node.view.workers
            if namespace in (None, w.namespace) and pod in (None, w.pod)
        ]

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {PROMETHEUS_CONTENT_TYPE: {}}}},
        tags=["metrics"],
    )
    async def metrics() -> Response:
        """Prometheus exposition (see docs/hypervisor.md for the names)."""
        body = await asyncio.to_thread(exposition, registry)
        return Response(body, media_type=PROMETHEUS_CONTENT_TYPE)

    return app


def readiness(context: ApiContext) -> dict[str, str]:
    """Per check "ok" or the problem."""
    view = context.node.view
    checks: dict[str, str] = {}
    snapshot = view.snapshot
    if snapshot is None:
        checks["nvml"] = "no GPU sample yet"
    elif snapshot.devices and all(not isinstance(d.uuid, str) for d in snapshot.devices):
        checks["nvml"] = "NVML gave no device"
    else:
        checks["nvml"] = "ok"
    base = context.shm_base_path
    checks["shm_base_path"] = (
        "ok" if os.access(base, os.W_OK | os.X_OK) else f"{base} is not writable"
    )
    checks["tasks"] = "ok" if context.running() else "a daemon task is restarting"
    return checks


def _limits_text(limits: Mapping[str, Limits]) -> str:
    parts = []
    for uuid, wanted in limits.items():
        memory = "unchanged" if wanted.memory is None else wanted.memory or "none"
        compute = "unchanged" if wanted.compute is None else f"{wanted.compute}%"
        parts.append(f"{uuid} memory={memory} compute={compute}")
    return "; ".join(parts)
