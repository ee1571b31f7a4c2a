"""/api/v1/gpus: the node's GPUs from the newest sample (a read of the "node" area)."""

from fastapi import APIRouter, Depends

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.api.context import API, ApiContext
from vgpu_hypervisor.daemon.api.errors import errors


def router(context: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=API, tags=["node"])

    @routes.get(
        "/gpus",
        response_model=list[models.Gpu],
        responses=errors(401),
        dependencies=[Depends(context.access.read("node"))],
    )
    async def gpus() -> list[models.Gpu]:
        return list(context.node.view.gpus)

    return routes
