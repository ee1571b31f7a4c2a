"""Fixtures of the Kubernetes tests: the API-server emulator, real kubectl and the official
Python client pointed at it, and the hypervisor tests' ones."""

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hypervisor.conftest import workloads
from tests.support.apiserver import ApiServer

__all__ = [
    "KUBECTL",
    "Kubectl",
    "api",
    "core",
    "kubectl",
    "needs_kubectl",
    "run_kubectl",
    "workloads",
]

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    server.up()
    yield server
    server.down()


def run_kubectl(
    kubeconfig: Path, home: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Real kubectl with that kubeconfig, its cache under ``home``."""
    assert KUBECTL is not None
    return subprocess.run(
        [KUBECTL, *args],
        input=stdin,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def kubectl(tmp_path: Path, api: ApiServer) -> Kubectl:
    """``kubectl(*args, stdin=…, ok=True)``: real kubectl against the stand-in; ``ok`` asserts
    that it succeeded."""
    config = api.kubeconfig(tmp_path / "kubeconfig")

    def run(
        *args: str, stdin: str | None = None, ok: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = run_kubectl(config, tmp_path, *args, stdin=stdin)
        if ok:
            assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stderr}"
        return result

    return run


@pytest.fixture
def core(tmp_path: Path, api: ApiServer) -> Iterator[Any]:
    """The official client's CoreV1Api (its classes carry no types)."""
    from kubernetes import client, config

    config_file = api.kubeconfig(tmp_path / "kubeconfig")
    api_client = config.new_client_from_config(str(config_file))  # type: ignore[no-untyped-call]
    try:
        yield client.CoreV1Api(api_client)
    finally:
        api_client.close()
