"""/metrics: Prometheus exposition of the newest view (names in docs/hypervisor.md); a read of
the "metrics" area (per pod limits and usage)."""

import asyncio

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from vgpu_hypervisor.daemon.api.context import ApiContext
from vgpu_hypervisor.daemon.api.errors import errors
from vgpu_hypervisor.daemon.metrics import exposition, prometheus_registry

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def router(context: ApiContext) -> APIRouter:
    routes = APIRouter(tags=["metrics"])
    driver = context.backend.driver_version
    registry = prometheus_registry(
        lambda: context.node.view, driver if isinstance(driver, str) else ""
    )

    @routes.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {PROMETHEUS_CONTENT_TYPE: {}}}, **errors(401)},
        dependencies=[Depends(context.access.read("metrics"))],
    )
    async def metrics() -> Response:
        """Prometheus exposition (see docs/hypervisor.md for the names)."""
        body = await asyncio.to_thread(exposition, registry)
        return Response(body, media_type=PROMETHEUS_CONTENT_TYPE)

    return routes
