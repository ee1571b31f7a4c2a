"""The daemon's HTTP API (FastAPI): health, readiness, status, GPUs, pods, workers, /metrics.

Reads are served from the newest NodeView (no file or driver access on a request). Changes need
the bearer token, and so do reads but /healthz, /readyz and /openapi.json unless the
api_open_reads setting opens them (auth.py); changes take their body as JSON (content_type.py);
query parameters come once each, and only those a route takes (query.py).
Errors: errors.py. What a client's connections may hold: limits.py and connections.py.
"""

from fastapi import Depends, FastAPI

from vgpu_hypervisor.daemon.api.context import ApiContext
from vgpu_hypervisor.daemon.api.errors import install_error_handlers
from vgpu_hypervisor.daemon.api.query import query_given_once
from vgpu_hypervisor.daemon.api.routes import freeze, gpus, health, metrics, node, pods, workers


def create_app(context: ApiContext) -> FastAPI:
    # No /docs or /redoc: their pages load Swagger UI and ReDoc from a CDN, blank on an
    # air-gapped node. /openapi.json is served; any OpenAPI viewer reads it (docs/hypervisor.md).
    app = FastAPI(
        title="tf-hypervisor",
        version=context.version,
        description="The vgpu node daemon: GPUs, pods with memory and compute limits, workers.",
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(query_given_once)],
        # No redirect of /api/v1/pods/ to /api/v1/pods: its Location was built from the
        # request's Host header, whatever that said. A path is served as it is spelt, or is the
        # 404 any unknown path gets.
        redirect_slashes=False,
    )
    install_error_handlers(app)
    for resource in (health, node, gpus, pods, freeze, workers, metrics):
        app.include_router(resource.router(context))
    return app
