"""In a cluster the daemon never offers the kubelet GPUs that do not exist: with --kubernetes or
--device-plugin on a node without the NVIDIA driver it stops, naming what is missing, and runs
the simulated GPU only when asked for with --simulate. Before, it fell back to the simulated GPU
and the kubelet was offered 20 vgpu.io/gpu on a driverless node."""

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest
from vgpu_hypervisor.gpu.backend import simulated_library

from tests.hypervisor.conftest import TF_HYPERVISOR, clean_environment, daemon_files


def driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def run_daemon(
    tmp_path: Path, *flags: str, environment: dict[str, str] | None = None
) -> "subprocess.CompletedProcess[str]":
    """`tf-hypervisor daemon` with ``flags`` (files under ``tmp_path``), to its end."""
    return subprocess.run(
        [
            *TF_HYPERVISOR,
            "daemon",
            *daemon_files(tmp_path),
            *flags,
        ],
        env=clean_environment() | (environment or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(driver_present(), reason="this machine has the NVIDIA driver")
@pytest.mark.parametrize("flags", [["--kubernetes"], ["--device-plugin", "--no-kubernetes"]])
def test_a_cluster_daemon_without_the_driver_stops_naming_it(
    tmp_path: Path, flags: list[str]
) -> None:
    result = run_daemon(tmp_path, *flags)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert "no NVIDIA driver" in result.stderr
    assert "the simulated GPU runs only with --simulate" in result.stderr
    assert not (tmp_path / "shm" / ".node").exists()  # nothing served


def test_the_simulated_library_on_the_path_is_no_driver(tmp_path: Path) -> None:
    """Found first as libnvidia-ml.so.1 (LD_LIBRARY_PATH), the simulated GPU's NVML is refused
    where the driver is asked for, and taken where either will do."""
    script = (
        "from vgpu_hypervisor.gpu import backend\n"
        "try:\n"
        "    backend.start(simulate=False)\n"
        "except backend.GpuBackendError as error:\n"
        "    print('refused:', error)\n"
        "info = backend.start(simulate=None)\n"
        "print('auto:', info.backend)\n"
    )
    environment = clean_environment() | {
        "LD_LIBRARY_PATH": str(simulated_library().parent),
        "VGPU_SIM_STATE": str(tmp_path / "node.state"),  # not the machine's default one
    }
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "refused: no NVIDIA driver: libnvidia-ml.so.1 is the simulated GPU's" in result.stdout
    assert "auto: simulated" in result.stdout
