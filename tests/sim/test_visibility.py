"""What one process does on the simulated GPU is seen from another through NVML (pynvml)."""

import signal
from typing import Any

import pytest

from tests.sim.conftest import SimEnv
from tests.sim.workload_runner import CONTEXT_OVERHEAD, GiB, holding, python

# Prints {"devices": [{"used": bytes, "processes": {pid: bytes}}, ...]}, or {"unusable": why}
# when the simulated NVML cannot answer yet (then the tests are skipped, saying why).
NVML_PROBE = """
import json
import pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as error:
    print(json.dumps({"unusable": f"nvmlInit: {error}"}))
    raise SystemExit(0)
devices = []
for index in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    devices.append({
        "used": pynvml.nvmlDeviceGetMemoryInfo(handle).used,
        "processes": {str(p.pid): p.usedGpuMemory for p in processes},
    })
pynvml.nvmlShutdown()
print(json.dumps({"devices": devices}))
"""


def nvml_view(environment: dict[str, str]) -> list[dict[str, Any]]:
    view = python(environment, NVML_PROBE)
    if "unusable" in view:
        pytest.skip(f"the simulated NVML is not usable yet: {view['unusable']}")
    devices: list[dict[str, Any]] = view["devices"]
    return devices


def test_nvml_sees_the_process_and_its_memory(sim_env: SimEnv) -> None:
    node = sim_env()
    assert nvml_view(node) == [{"used": 0, "processes": {}}] * 2
    with holding(node, "--device", "1", "--alloc", "3GiB", "--kernels", "1") as (_, report):
        pid = str(report["pid"])
        idle, busy = nvml_view(node)
        assert idle == {"used": 0, "processes": {}}
        assert busy["processes"] == {pid: 3 * GiB + CONTEXT_OVERHEAD}
        assert busy["used"] == 3 * GiB + CONTEXT_OVERHEAD


def test_nvml_sees_every_process(sim_env: SimEnv) -> None:
    node = sim_env()
    with (
        holding(node, "--alloc", "1GiB", "--kernels", "0") as (_, first),
        holding(node, "--alloc", "2GiB", "--kernels", "0") as (_, second),
    ):
        device = nvml_view(node)[0]
        assert device["processes"] == {
            str(first["pid"]): 1 * GiB + CONTEXT_OVERHEAD,
            str(second["pid"]): 2 * GiB + CONTEXT_OVERHEAD,
        }
        assert device["used"] == 3 * GiB + 2 * CONTEXT_OVERHEAD


def test_nvml_forgets_a_killed_process(sim_env: SimEnv) -> None:
    node = sim_env()
    with holding(node, "--alloc", "2GiB", "--kernels", "0") as (holder, report):
        assert str(report["pid"]) in nvml_view(node)[0]["processes"]
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        assert nvml_view(node)[0] == {"used": 0, "processes": {}}
