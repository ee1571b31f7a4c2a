"""Fixtures of the Kubernetes tests: the API-server emulator, and the hypervisor tests' ones."""

from collections.abc import Iterator

import pytest

from tests.hypervisor.conftest import workloads
from tests.support.apiserver import ApiServer

__all__ = ["api", "workloads"]


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    server.up()
    yield server
    server.down()
