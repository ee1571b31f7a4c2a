"""The daemon's HTTP API (FastAPI): health, readiness, status, GPUs, pods, workers, /metrics.

Reads are served from the newest NodeView (no file or driver access on a request); changes
need the bearer token (routes/pods.py). Errors: errors.py.
"""

from fastapi import FastAPI

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.api.context import ApiContext
from vgpu_hypervisor.daemon.api.errors import install_error_handlers
from vgpu_hypervisor.daemon.api.routes import freeze, gpus, health, metrics, node, pods, workers


def create_app(context: ApiContext) -> FastAPI:
    app = FastAPI(
        title="tf-hypervisor",
        version=context.version,
        description="The vgpu node daemon: GPUs, pods with memory and compute limits, workers.",
        responses={422: {"model": models.ErrorDocument}},
    )
    install_error_handlers(app)
    for resource in (health, node, gpus, pods, freeze, workers, metrics):
        app.include_router(resource.router(context))
    return app
