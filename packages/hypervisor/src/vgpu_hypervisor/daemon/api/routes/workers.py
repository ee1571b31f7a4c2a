"""/api/v1/workers: the processes in the pods' regions, by namespace and pod."""

from typing import Annotated

from fastapi import APIRouter, Query

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.api.context import API, ApiContext
from vgpu_hypervisor.daemon.api.errors import errors


def router(context: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=API, tags=["workers"])

    @routes.get("/workers", response_model=list[models.Worker], responses=errors(422))
    async def workers(
        namespace: Annotated[str | None, Query(pattern=models.NAME_PATTERN)] = None,
        pod: Annotated[str | None, Query(pattern=models.NAME_PATTERN)] = None,
    ) -> list[models.Worker]:
        return [
            w
            for w in context.node.view.workers
            if namespace in (None, w.namespace) and pod in (None, w.pod)
        ]

    return routes
