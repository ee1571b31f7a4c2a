"""A real `tf-hypervisor daemon` on a fresh simulated node, and workloads run in its pods."""

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from vgpu_limiter import library_path, sim

WORKLOAD = str(sim.workload_path())
TF_HYPERVISOR = [sys.executable, "-m", "vgpu_hypervisor"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def daemon_files(folder: Path) -> list[str]:
    """Flags that keep a daemon run by a test to files of its own, under ``folder``."""
    return [
        "--config",
        "",
        "--shm-base-path",
        str(folder / "shm"),
        "--token-file",
        str(folder / "token"),
    ]


def clean_environment() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            (
                "VGPU_SIM_",
                "TF_",
                "TENSOR_FUSION_",
                "CUDA_",
                "POD_",
                "SHM_",
                "API_LISTEN",
                "GPU_METRICS",
            )
        )
    }


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, step: float = 0.05) -> Any:
    """The first truthy value of condition() within timeout; AssertionError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)


class TokenFile(httpx.Auth):
    """The daemon's token from its file, read as each request goes (the daemon writes the file
    when it starts): reads need it too. A request that names its own Authorization keeps it;
    one sent with ``auth=httpx.Auth()`` (or None) goes without."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if "authorization" not in request.headers and self.path.is_file():
            request.headers["Authorization"] = f"Bearer {self.path.read_text().strip()}"
        yield request


class Daemon:
    """One daemon process (restartable) with its node: sim state, base path, token, metrics."""

    def __init__(self, root: Path, gpus: int = 2, extra: tuple[str, ...] = ()) -> None:
        self.root = root
        self.port = free_port()
        self.base = root / "shm"
        self.token_file = root / "token"
        self.metrics_file = root / "metrics.influx"
        self.log_file = root / "daemon.log"
        self.state = root / "node.state"
        self.extra = extra
        self.environment = clean_environment() | {"VGPU_SIM_DEVICES": str(gpus)}
        self.process: subprocess.Popen[bytes] | None = None
        self.launcher = list(TF_HYPERVISOR)  # the command line up to the CLI's arguments
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}", timeout=10, auth=TokenFile(self.token_file)
        )

    @property
    def flags(self) -> list[str]:
        return ["--listen", f"127.0.0.1:{self.port}", "--token-file", str(self.token_file)]

    def start(self) -> None:
        command = [
            *self.launcher,
            "daemon",
            "--simulate",
            "--sim-state",
            str(self.state),
            "--shm-base-path",
            str(self.base),
            "--metrics-file",
            str(self.metrics_file),
            "--log-path",
            str(self.log_file),
            "--config",
            "",
            # The simulator's contexts take 512 MiB, as the workloads here say they do.
            "--context-charge",
            "512MiB",
            *self.flags,
            *self.extra,
        ]
        self.process = subprocess.Popen(command, env=self.environment, stderr=subprocess.PIPE)
        wait_for(self._healthy, timeout=30)

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            stderr = self.process.stderr.read().decode() if self.process.stderr else ""
            raise AssertionError(f"daemon exited {self.process.returncode}: {stderr}")
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def stop(self, signum: int = signal.SIGTERM) -> int:
        assert self.process is not None
        self.process.send_signal(signum)
        code = self.process.wait(timeout=20)
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None
        return code

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def api(self, method: str, path: str, *, auth: bool = True, **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}))
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        return self.http.request(method, path, headers=headers, auth=None, **kwargs)

    def cli(
        self, *args: str, stdin: str | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*TF_HYPERVISOR, *args, *self.flags],
            env=self.environment,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def workload_environment(
        self, pod: str, namespace: str = "default", **extra: str
    ) -> dict[str, str]:
        base = clean_environment()
        return (
            base
            | sim.environment(state=self.state, base=base)
            | {
                "VGPU_SIM_DEVICES": self.environment["VGPU_SIM_DEVICES"],
                "LD_PRELOAD": str(library_path()),
                "SHM_BASE_PATH": str(self.base),
                "POD_NAME": pod,
                "POD_NAMESPACE": namespace,
                "TF_CUDA_CONTEXT_OVERHEAD": "512MiB",
            }
            | extra
        )

    def workload(self, pod: str, *args: str, namespace: str = "default") -> subprocess.Popen[str]:
        return subprocess.Popen(
            [WORKLOAD, *args],
            env=self.workload_environment(pod, namespace),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def close(self) -> None:
        if self.process is not None:
            self.stop(signal.SIGKILL)
        self.http.close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = Daemon(tmp_path)
    running.start()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def workloads() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; killed at its end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


class Said(logging.Handler):
    """What the daemon logs, whatever its logger's settings (a daemon run in this process
    stops its propagation)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
