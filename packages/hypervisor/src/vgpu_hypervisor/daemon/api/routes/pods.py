"""/api/v1/pods: list, create, show, change and delete pods (changes need the token, and so do
reads unless the "pods" read area is open).

A change goes to the region files in a worker thread, one change at a time, and is followed by
a fresh view, so the reply shows what it did."""

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi import Path as PathParam
from vgpu_common.limits import GpuLimits, Qos, format_size, names_gpu, normalize_uuid

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.api.content_type import JsonBodyRoute
from vgpu_hypervisor.daemon.api.context import API, ApiContext
from vgpu_hypervisor.daemon.api.errors import ApiError, errors
from vgpu_hypervisor.daemon.node import NodeView
from vgpu_hypervisor.daemon.pods import PodNotFound

log = logging.getLogger("vgpu_hypervisor.api")
NameParam = Annotated[str, PathParam(pattern=models.NAME_PATTERN, max_length=253)]
ONE_POD = "/pods/{namespace}/{name}"


def resolve_gpus(
    view: NodeView, gpus: Mapping[str, models.GpuLimitsRequest]
) -> dict[str, GpuLimits]:
    """Limits by GPU UUID from limits by index or UUID, checked against this node's GPUs."""
    resolved: dict[str, GpuLimits] = {}
    for key, wanted in gpus.items():
        gpu = next((gpu for gpu in view.gpus if names_gpu(key, gpu.index, gpu.uuid)), None)
        if gpu is None or gpu.uuid is None:
            count = len(view.gpus)
            raise ApiError(422, f"gpus.{key}: no such GPU on this node ({count} GPU(s))")
        uuid = normalize_uuid(gpu.uuid)
        if uuid in resolved:
            raise ApiError(422, f"gpus.{key}: GPU {uuid} is given twice")
        limits = wanted.limits()
        memory, total = limits.memory, gpu.memory_total
        if isinstance(memory, int) and total and memory > total:
            raise ApiError(
                422,
                f"gpus.{key}.memory: {format_size(memory)} is more than the GPU's "
                f"{format_size(total)}",
            )
        resolved[uuid] = limits
    return resolved


def _change_text(
    limits: Mapping[str, GpuLimits], qos: Qos | None = None, weight: int | None = None
) -> str:
    """A change in words for the log: each GPU's limits given, then the class and weight."""
    parts = [f"{uuid} {wanted}" for uuid, wanted in limits.items()]
    policy = " ".join(
        f"{name}={value}"
        for name, value in (("qos", None if qos is None else qos.label), ("weight", weight))
        if value is not None
    )  # fmt: skip
    return "; ".join(parts + ([policy] if policy else []))


def router(context: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=API, tags=["pods"], route_class=JsonBodyRoute)
    changes_need_token = [Depends(context.access.change())]
    reads_need_token = [Depends(context.access.read("pods"))]
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

    @routes.get(
        "/pods",
        response_model=list[models.Pod],
        responses=errors(401, 422),
        dependencies=reads_need_token,
    )
    async def pods(
        namespace: Annotated[str | None, Query(pattern=models.NAME_PATTERN)] = None,
    ) -> list[models.Pod]:
        return [p for p in context.node.view.pods if namespace in (None, p.namespace)]

    @routes.post(
        "/pods",
        response_model=models.Pod,
        status_code=201,
        responses=errors(401, 409, 415, 422),
        dependencies=changes_need_token,
    )
    async def create_pod(request: models.PodCreate) -> models.Pod:
        """Create a pod's region with limits per GPU (by index or UUID)."""
        limits = resolve_gpus(context.node.view, request.gpus)
        qos = request.qos

        def create() -> None:
            store.create(
                request.namespace, request.name, limits, owner=request.owner, group=request.group
            )
            if qos is not None or request.weight is not None:
                store.set_policy(request.namespace, request.name, qos, request.weight)

        await change(create)
        log.info(
            "pod %s/%s created: %s",
            request.namespace,
            request.name,
            _change_text(limits, qos, request.weight),
        )
        return found(request.namespace, request.name)

    @routes.get(
        ONE_POD,
        response_model=models.Pod,
        responses=errors(401, 404, 422),
        dependencies=reads_need_token,
    )
    async def get_pod(namespace: NameParam, name: NameParam) -> models.Pod:
        return found(namespace, name)

    @routes.patch(
        ONE_POD,
        response_model=models.Pod,
        responses=errors(401, 404, 409, 415, 422),
        dependencies=changes_need_token,
    )
    async def update_pod(
        namespace: NameParam, name: NameParam, request: models.PodUpdate
    ) -> models.Pod:
        """Change limits live: running workers see them within a second."""
        limits = resolve_gpus(context.node.view, request.gpus or {})
        qos = request.qos
        if not limits and qos is None and request.weight is None:
            raise ApiError(422, "nothing to change: give gpus, qos or weight")

        def update() -> None:
            if limits:
                store.update(namespace, name, limits)
            if qos is not None or request.weight is not None:
                store.set_policy(namespace, name, qos, request.weight)

        await change(update)
        log.info(
            "pod %s/%s updated: %s", namespace, name, _change_text(limits, qos, request.weight)
        )
        return found(namespace, name)

    @routes.delete(
        ONE_POD,
        response_model=models.Pod,
        responses=errors(401, 404, 409, 422),
        dependencies=changes_need_token,
    )
    async def delete_pod(
        namespace: NameParam,
        name: NameParam,
        force: Annotated[bool, Query(description="Delete even with live workers.")] = False,
    ) -> models.Pod:
        """Remove a pod's region; refused (409) while its workers live, unless force."""
        pod = found(namespace, name)
        await change(lambda: store.delete(namespace, name, force=force))
        log.info("pod %s/%s deleted%s", namespace, name, " (forced)" if force else "")
        return pod

    return routes
