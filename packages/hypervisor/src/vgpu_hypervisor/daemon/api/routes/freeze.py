"""/api/v1/pods/{namespace}/{name}/freeze and /resume (need the token): a frozen pod's launches
wait in the limiter until resume; the daemon holds the freeze (daemon/pods.py)."""

import asyncio
import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi import Path as PathParam
from vgpu_common.limits import GPU_KEY_PATTERN, names_gpu

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.api.context import API, ApiContext
from vgpu_hypervisor.daemon.api.errors import ApiError, errors
from vgpu_hypervisor.daemon.pods import PodNotFound

log = logging.getLogger("vgpu_hypervisor.api")
NameParam = Annotated[str, PathParam(pattern=models.NAME_PATTERN, max_length=253)]
ONE_POD = "/pods/{namespace}/{name}"


def router(context: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=API, tags=["pods"])
    changes_need_token = [Depends(context.access.change())]
    changes = asyncio.Lock()
    store = context.node.store

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

    @routes.post(
        ONE_POD + "/freeze",
        response_model=models.Pod,
        responses=errors(401, 404, 409, 422),
        dependencies=changes_need_token,
    )
    async def freeze_pod(
        namespace: NameParam,
        name: NameParam,
        gpu: Annotated[
            str | None,
            Query(pattern=GPU_KEY_PATTERN, description="Freeze this GPU only (index or UUID)."),
        ] = None,
    ) -> models.Pod:
        """Freeze a pod: its workers' next launches wait until resume; memory stays."""
        pod = found(namespace, name)
        uuid = None
        if gpu is not None:
            uuid = next((g.uuid for g in pod.gpus if names_gpu(gpu, g.index, g.uuid)), None)
            if uuid is None:
                raise ApiError(422, f"gpu {gpu}: pod {namespace}/{name} has no limits on it")
        await change(lambda: store.freeze(namespace, name, uuid))
        log.info("pod %s/%s frozen%s", namespace, name, f" on {uuid}" if uuid else "")
        return found(namespace, name)

    @routes.post(
        ONE_POD + "/resume",
        response_model=models.Pod,
        responses=errors(401, 404, 409, 422),
        dependencies=changes_need_token,
    )
    async def resume_pod(
        namespace: NameParam,
        name: NameParam,
        gpu: Annotated[str | None, Query(include_in_schema=False)] = None,
    ) -> models.Pod:
        """Resume a frozen pod (every GPU): its waiting launches go on at once."""
        if gpu is not None:  # ignored, it resumed every GPU while the caller meant one
            raise ApiError(422, "a resume resumes every GPU of the pod: give no gpu")
        found(namespace, name)
        await change(lambda: store.resume(namespace, name))
        log.info("pod %s/%s resumed", namespace, name)
        return found(namespace, name)

    return routes
