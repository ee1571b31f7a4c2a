"""/api/v1/workers: the processes in the pods' regions, by namespace and pod (a read of the
"workers" area). Command lines go only to a caller with a token, even where the area is open:
they carry what people pass on them, passwords and tokens included."""

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.api.auth import Caller
from vgpu_hypervisor.daemon.api.context import API, ApiContext
from vgpu_hypervisor.daemon.api.errors import errors


def router(context: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=API, tags=["workers"])

    reader = context.access.read("workers")

    @routes.get("/workers", response_model=list[models.Worker], responses=errors(401, 422))
    async def workers(
        caller: Annotated[Caller, Depends(reader)],
        namespace: Annotated[str | None, Query(pattern=models.NAME_PATTERN)] = None,
        pod: Annotated[str | None, Query(pattern=models.NAME_PATTERN)] = None,
    ) -> list[models.Worker]:
        chosen = [
            w
            for w in context.node.view.workers
            if namespace in (None, w.namespace) and pod in (None, w.pod)
        ]
        if caller.authenticated:
            return chosen
        return [w.model_copy(update={"command": None}) for w in chosen]

    return routes
