"""/healthz (the daemon answers) and /readyz (NVML answered, the base path is writable and has
room for a pod region, every daemon task runs, and in Kubernetes the API server answered the
last list or watch of the node's pods)."""

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.api.context import ApiContext, readiness


def router(context: ApiContext) -> APIRouter:
    routes = APIRouter(tags=["health"])

    @routes.get("/healthz", response_model=models.Health)
    async def health() -> models.Health:
        """The daemon answers."""
        return models.Health(status="ok")

    @routes.get(
        "/readyz", response_model=models.Readiness, responses={503: {"model": models.Readiness}}
    )
    async def ready() -> Any:
        """NVML answered, the base path is writable and has room, the daemon's tasks run, the
        API server answers (in Kubernetes)."""
        checks = readiness(context)
        document = models.Readiness(ready=all(v == "ok" for v in checks.values()), checks=checks)
        if document.ready:
            return document
        return JSONResponse(document.model_dump(), status_code=503)

    return routes
