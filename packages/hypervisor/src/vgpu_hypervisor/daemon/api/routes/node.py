"""/api/v1/status: the daemon and its node in figures (a read of the "node" area)."""

import time

from fastapi import APIRouter, Depends

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.api.context import API, ApiContext, readiness
from vgpu_hypervisor.daemon.api.errors import errors


def router(context: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=API, tags=["node"])

    @routes.get(
        "/status",
        response_model=models.Status,
        responses=errors(401),
        dependencies=[Depends(context.access.read("node"))],
    )
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

    return routes
