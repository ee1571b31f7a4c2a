"""The store's errors name what went wrong and carry no HTTP status: the API maps each kind to
its answer, and a region error (the tenant's file) is never a 500."""

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from vgpu_hypervisor.daemon.api.errors import install_error_handlers
from vgpu_hypervisor.daemon.pods import PodConflict, PodError, PodNotFound
from vgpu_limiter.region import RegionError


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (PodError("GPU 0: bad compute limit 300"), 422),
        (PodNotFound("no pod ml/train"), 404),
        (PodConflict("pod ml/train already exists"), 409),
        (RegionError("/run/shm/ml/train/shm: truncated"), 409),
    ],
)
def test_each_domain_error_is_answered_with_its_status(error: Exception, status: int) -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/fails")
    def fails() -> None:
        raise error

    reply = TestClient(app).get("/fails")
    assert reply.status_code == status
    assert str(error) in reply.json()["error"]


def test_the_domain_errors_carry_no_http_status() -> None:
    for kind in (PodError, PodNotFound, PodConflict):
        assert not hasattr(kind("x"), "status")
