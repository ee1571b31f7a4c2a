"""/api/v1/gpus: the node's GPUs from the newest sample."""

from fastapi import APIRouter

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.api.context import API, ApiContext


def router(context: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=API, tags=["node"])

    @routes.get("/gpus", response_model=list[models.Gpu])
    async def gpus() -> list[models.Gpu]:
        return list(context.node.view.gpus)

    return routes
