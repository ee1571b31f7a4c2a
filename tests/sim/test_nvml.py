"""The simulated NVML (libnvidia-ml.so.1) as pynvml and raw ctypes callers see it.

Each check runs in a fresh Python process: pynvml loads the library through LD_LIBRARY_PATH,
and every test gets its own simulated node (state file) from the sim_env fixture. Work on the
GPU (contexts, memory, kernels) comes from the simulated driver, called through ctypes.
"""

import json
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from vgpu_limiter import sim

from tests.support import elf

SimEnv = Callable[..., dict[str, str]]

GiB = 1 << 30
MiB = 1 << 20
ABI_HEADER = Path(__file__).resolve().parents[2] / "packages/limiter/csrc/include/nvml_abi.h"

# Helpers for the subprocesses: `error` names the pynvml exception a call raises.
NVML_PRELUDE = """
import ctypes, json, os, sys, time
import pynvml

def error(call):
    try:
        call()
    except pynvml.NVMLError as exc:
        return type(exc).__name__
    return None

pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
"""

# The simulated driver through ctypes: a kernel's duration in ns is its first parameter.
DRIVER_PRELUDE = """
import ctypes

cuda = ctypes.CDLL("libcuda.so.1")

def check(result, what):
    if result != 0:
        raise SystemExit(f"{what}: CUresult {result}")

check(cuda.cuInit(0), "cuInit")

def use_device(ordinal):
    context = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), ordinal), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")

def allocate(size):
    pointer = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)), "cuMemAlloc_v2")
    return pointer.value

def kernel():
    module = ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(module), b"simulated image"), "cuModuleLoadData")
    function = ctypes.c_void_p()
    check(cuda.cuModuleGetFunction(ctypes.byref(function), module, b"busy"), "cuModuleGetFunction")
    return function

def launch(function, duration_ns):
    duration = ctypes.c_uint64(duration_ns)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(duration), ctypes.c_void_p))
    check(cuda.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, None, params, None), "cuLaunchKernel")

def synchronize():
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
"""


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def query(code: str, env: dict[str, str], *, driver: bool = False) -> Any:
    """Runs `code` after nvmlInit (and the driver helpers); it sets `result`, returned as JSON."""
    script = (
        (DRIVER_PRELUDE if driver else "")
        + NVML_PRELUDE
        + textwrap.dedent(code)
        + "\nprint(json.dumps(result))\n"
    )
    done = run_python(script, env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _api_table() -> str:
    text = ABI_HEADER.read_text()
    match = re.search(r"^#define VGPU_NVML_API\(X\)(?:.*\\\n)*.*\n", text, re.MULTILINE)
    assert match, "VGPU_NVML_API table not found"
    return match.group(0)


def _driver_ready() -> bool:
    try:
        exported = elf.exported_symbols(sim.library_dir() / "libcuda.so.1")
    except (FileNotFoundError, subprocess.CalledProcessError):
        return False
    needed = {"cuInit", "cuDevicePrimaryCtxRetain", "cuMemAlloc_v2", "cuLaunchKernel"}
    return needed <= exported


needs_driver = pytest.mark.skipif(
    not _driver_ready(),
    reason="the simulated driver libcuda.so.1 does not export cuInit, cuLaunchKernel... yet",
)


def test_every_entry_point_of_the_table_is_exported() -> None:
    symbols = set(re.findall(r"X\((nvml\w+),", _api_table()))
    expected = {"nvmlInit_v2", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetProcessUtilization"}
    assert expected <= symbols
    exported = elf.exported_symbols(sim.library_dir() / "libnvidia-ml.so.1")
    assert symbols - exported == set()
    assert {s for s in exported if s.startswith("nvml")} == symbols


def test_default_node_has_two_h100s(sim_env: SimEnv) -> None:
    result = query(
        """
        devices = []
        index_of = pynvml.nvmlDeviceGetIndex
        by_bus = pynvml.nvmlDeviceGetHandleByPciBusId
        for h in handles:
            pci = pynvml.nvmlDeviceGetPciInfo(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            devices.append({
                "name": pynvml.nvmlDeviceGetName(h),
                "uuid": uuid,
                "total": pynvml.nvmlDeviceGetMemoryInfo(h).total,
                "bus_id": pci.busId,
                "legacy": pci.busIdLegacy,
                "cc": list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                "minor": pynvml.nvmlDeviceGetMinorNumber(h),
                "by_uuid": index_of(pynvml.nvmlDeviceGetHandleByUUID(uuid.lower())),
                "by_pci": index_of(by_bus(pci.busId)),
                "by_legacy": index_of(by_bus(pci.busIdLegacy)),
                "persistence": pynvml.nvmlDeviceGetPersistenceMode(h),
                "compute_mode": pynvml.nvmlDeviceGetComputeMode(h),
            })
        result = {
            "devices": devices,
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "nvml": pynvml.nvmlSystemGetNVMLVersion(),
            "cuda": pynvml.nvmlSystemGetCudaDriverVersion(),
            "cuda_v2": pynvml.nvmlSystemGetCudaDriverVersion_v2(),
        }
        """,
        sim_env(),
    )
    devices = result["devices"]
    assert len(devices) == 2
    for index, device in enumerate(devices):
        assert device["name"] == "NVIDIA H100 80GB HBM3"
        assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", device["uuid"])
        assert device["total"] == 80 * GiB
        assert device["bus_id"] == f"00000000:{0x18 + index:02X}:00.0"
        assert device["legacy"] == f"0000:{0x18 + index:02X}:00.0"
        assert device["cc"] == [9, 0]
        assert device["minor"] == device["by_uuid"] == device["by_pci"] == index
        assert device["by_legacy"] == index
        assert device["persistence"] == 1
        assert device["compute_mode"] == 0
    assert devices[0]["uuid"] != devices[1]["uuid"]
    assert result["driver"] == "580.95.05"
    assert result["nvml"] == "13.580.95.05"
    assert result["cuda"] == result["cuda_v2"] == 13000


def test_devices_from_vgpu_sim_devices(sim_env: SimEnv) -> None:
    env = sim_env(devices="count=3,memory=40GiB,name=NVIDIA A100-SXM4-40GB,cc=8.0")
    result = query(
        """
        result = [
            [pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetMemoryInfo(h).total,
             list(pynvml.nvmlDeviceGetCudaComputeCapability(h)), pynvml.nvmlDeviceGetUUID(h)]
            for h in handles
        ]
        """,
        env,
    )
    assert [row[:3] for row in result] == [["NVIDIA A100-SXM4-40GB", 40 * GiB, [8, 0]]] * 3
    assert len({row[3] for row in result}) == 3


def test_node_without_devices_initializes(sim_env: SimEnv) -> None:
    assert query("result = len(handles)", sim_env(devices="0")) == 0


def test_memory_info_v1_and_v2_on_an_idle_device(sim_env: SimEnv) -> None:
    result = query(
        """
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handles[1])
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handles[1], version=pynvml.nvmlMemory_v2)
        result = {
            "v1": [v1.total, v1.free, v1.used],
            "v2": [v2.version, v2.total, v2.reserved, v2.free, v2.used],
            "bad_version": error(lambda: pynvml.nvmlDeviceGetMemoryInfo(handles[1], version=1)),
        }
        """,
        sim_env(),
    )
    assert result["v1"] == [80 * GiB, 80 * GiB, 0]
    assert result["v2"] == [0x02000028, 80 * GiB, 0, 80 * GiB, 0]
    assert result["bad_version"] == "NVMLError_ArgumentVersionMismatch"


def test_errors_through_pynvml(sim_env: SimEnv) -> None:
    result = query(
        """
        h = handles[0]
        result = {
            "bad_index": error(lambda: pynvml.nvmlDeviceGetHandleByIndex(2)),
            "mig": error(lambda: pynvml.nvmlDeviceGetMigMode(h)),
            "unknown_uuid": error(lambda: pynvml.nvmlDeviceGetHandleByUUID(
                "GPU-00000000-0000-0000-0000-000000000000")),
            "bad_uuid": error(lambda: pynvml.nvmlDeviceGetHandleByUUID("GPU-1")),
            "unknown_bus": error(lambda: pynvml.nvmlDeviceGetHandleByPciBusId("0000:99:00.0")),
            "bad_bus": error(lambda: pynvml.nvmlDeviceGetHandleByPciBusId("somewhere")),
            "idle_samples": error(lambda: pynvml.nvmlDeviceGetProcessUtilization(h, 0)),
            "message": pynvml.nvmlErrorString(pynvml.NVML_ERROR_NOT_SUPPORTED),
        }
        pynvml.nvmlInit()  # counted: one shutdown leaves it initialized
        pynvml.nvmlShutdown()
        result["after_one_shutdown"] = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        result["after_last_shutdown"] = error(lambda: pynvml.nvmlDeviceGetCount())
        result["extra_shutdown"] = error(lambda: pynvml.nvmlShutdown())
        """,
        sim_env(),
    )
    assert result == {
        "bad_index": "NVMLError_InvalidArgument",
        "mig": "NVMLError_NotSupported",
        "unknown_uuid": "NVMLError_NotFound",
        "bad_uuid": "NVMLError_InvalidArgument",
        "unknown_bus": "NVMLError_NotFound",
        "bad_bus": "NVMLError_InvalidArgument",
        "idle_samples": "NVMLError_NotFound",
        "message": "Not Supported",
        "after_one_shutdown": 2,
        "after_last_shutdown": "NVMLError_Uninitialized",
        "extra_shutdown": "NVMLError_Uninitialized",
    }


def test_raw_calls_check_arguments_and_buffer_sizes(sim_env: SimEnv) -> None:
    """What pynvml never does: NULL pointers, forged handles, short buffers, calls before init."""
    script = """
    import ctypes, json
    from ctypes import byref, c_char_p, c_uint, c_void_p, create_string_buffer

    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    nvml.nvmlErrorString.restype = c_char_p
    count = c_uint(0)
    result = {"count_before_init": nvml.nvmlDeviceGetCount_v2(byref(count))}
    result["init"] = nvml.nvmlInit_v2()
    h = c_void_p()
    nvml.nvmlDeviceGetHandleByIndex_v2(0, byref(h))
    name = create_string_buffer(96)
    uuid = create_string_buffer(96)
    result |= {
        "count_null": nvml.nvmlDeviceGetCount_v2(None),
        "handle_null": nvml.nvmlDeviceGetHandleByIndex_v2(0, None),
        "name_short": nvml.nvmlDeviceGetName(h, name, 21),
        "name_exact": nvml.nvmlDeviceGetName(h, name, 22),
        "name_null": nvml.nvmlDeviceGetName(h, None, 96),
        "uuid_short": nvml.nvmlDeviceGetUUID(h, uuid, 40),
        "uuid_exact": nvml.nvmlDeviceGetUUID(h, uuid, 41),
        "driver_short": nvml.nvmlSystemGetDriverVersion(name, 4),
        "forged_handle": nvml.nvmlDeviceGetName(c_void_p(4096), name, 96),
        "misaligned_handle": nvml.nvmlDeviceGetName(c_void_p(h.value + 1), name, 96),
        "null_handle": nvml.nvmlDeviceGetName(None, name, 96),
        "memory_null": nvml.nvmlDeviceGetMemoryInfo(h, None),
        "processes_null_count": nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, None, None),
        "processes_none": nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, byref(count), None),
        "processes_count": count.value,
        "samples_null_count": nvml.nvmlDeviceGetProcessUtilization(h, None, None, 0),
        "temperature_bad_sensor": nvml.nvmlDeviceGetTemperature(h, 7, byref(count)),
        "clock_bad_type": nvml.nvmlDeviceGetClockInfo(h, 9, byref(count)),
        "unknown_code": nvml.nvmlErrorString(12345).decode(),
        "shutdown": nvml.nvmlShutdown(),
        "shutdown_again": nvml.nvmlShutdown(),
        "name_after_shutdown": nvml.nvmlDeviceGetName(h, name, 96),
    }
    print(json.dumps(result))
    """
    done = run_python(textwrap.dedent(script), sim_env())
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    success, uninitialized, invalid, insufficient = 0, 1, 2, 7
    assert result == {
        "count_before_init": uninitialized,
        "init": success,
        "count_null": invalid,
        "handle_null": invalid,
        "name_short": insufficient,  # "NVIDIA H100 80GB HBM3" is 21 characters
        "name_exact": success,
        "name_null": invalid,
        "uuid_short": insufficient,
        "uuid_exact": success,
        "driver_short": insufficient,
        "forged_handle": invalid,
        "misaligned_handle": invalid,
        "null_handle": invalid,
        "memory_null": invalid,
        "processes_null_count": invalid,
        "processes_none": success,
        "processes_count": 0,
        "samples_null_count": invalid,
        "temperature_bad_sensor": invalid,
        "clock_bad_type": invalid,
        "unknown_code": "Unknown Error",
        "shutdown": success,
        "shutdown_again": uninitialized,
        "name_after_shutdown": uninitialized,
    }


def test_bad_device_config_fails_init_and_names_the_variable(sim_env: SimEnv) -> None:
    script = """
    import pynvml
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        print(type(exc).__name__)
    """
    done = run_python(textwrap.dedent(script), sim_env(devices="memory=lots"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "NVMLError_DriverNotLoaded"
    assert "VGPU_SIM_DEVICES" in done.stderr
    assert "memory=lots" in done.stderr


def test_idle_telemetry_is_plausible(sim_env: SimEnv) -> None:
    result = query(
        """
        h = handles[0]
        result = {
            "utilization": [pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                            pynvml.nvmlDeviceGetUtilizationRates(h).memory],
            "temperature": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "power": pynvml.nvmlDeviceGetPowerUsage(h),
            "limit": pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
            "management_limit": pynvml.nvmlDeviceGetPowerManagementLimit(h),
            "sm_clock": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "sm_max": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "fan": pynvml.nvmlDeviceGetFanSpeed(h),
            "pstate": pynvml.nvmlDeviceGetPerformanceState(h),
            "graphics_processes": pynvml.nvmlDeviceGetGraphicsRunningProcesses(h),
        }
        """,
        sim_env(),
    )
    assert result["utilization"] == [0, 0]
    assert 20 <= result["temperature"] <= 50
    assert 0 < result["power"] < result["limit"] == result["management_limit"]
    assert 0 < result["sm_clock"] < result["sm_max"]
    assert result["mem_clock"] > 0
    assert 0 <= result["fan"] <= 100
    assert result["pstate"] == 0
    assert result["graphics_processes"] == []


@needs_driver
def test_utilization_follows_kernels(sim_env: SimEnv) -> None:
    """500 ms of kernels, then a query one second after they started: about 50 % busy."""
    result = query(
        """
        use_device(0)
        function = kernel()
        started = time.monotonic()
        for _ in range(5):
            launch(function, 100_000_000)
        synchronize()
        time.sleep(max(0.0, started + 1.0 - time.monotonic()))
        busy = pynvml.nvmlDeviceGetUtilizationRates(handles[0])
        samples = pynvml.nvmlDeviceGetProcessUtilization(handles[0], 0)

        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        count = ctypes.c_uint(0)
        get_samples = nvml.nvmlDeviceGetProcessUtilization
        size_query = get_samples(handles[0], None, ctypes.byref(count), 0)
        size = count.value
        count.value = 0
        buffer = (pynvml.c_nvmlProcessUtilizationSample_t * 4)()
        short_buffer = get_samples(handles[0], buffer, ctypes.byref(count), 0)

        last_seen = max(s.timeStamp for s in samples)
        time.sleep(0.05)
        result = {
            "gpu": busy.gpu,
            "memory": busy.memory,
            "other_gpu": pynvml.nvmlDeviceGetUtilizationRates(handles[1]).gpu,
            "samples": [[s.pid, s.smUtil, s.timeStamp] for s in samples],
            "pid": os.getpid(),
            "now_us": int(time.time() * 1e6),
            "size_query": [size_query, size],
            "short_buffer": [short_buffer, count.value],
            "since_last_seen": error(
                lambda: pynvml.nvmlDeviceGetProcessUtilization(handles[0], last_seen)),
            "temperature": pynvml.nvmlDeviceGetTemperature(handles[0], 0),
            "idle_temperature": pynvml.nvmlDeviceGetTemperature(handles[1], 0),
        }
        """,
        sim_env(),
        driver=True,
    )
    assert 35 <= result["gpu"] <= 65
    assert 0 < result["memory"] < result["gpu"]
    assert result["other_gpu"] == 0
    [[pid, sm_util, stamp]] = result["samples"]
    assert pid == result["pid"]
    assert 35 <= sm_util <= 65
    assert abs(stamp - result["now_us"]) < 5_000_000  # wall-clock microseconds
    assert result["size_query"] == [7, 1]  # NVML_ERROR_INSUFFICIENT_SIZE, one sample
    assert result["short_buffer"] == [7, 1]
    assert result["since_last_seen"] == "NVMLError_NotFound"
    assert result["temperature"] > result["idle_temperature"]


@needs_driver
def test_processes_memory_and_busy_time_of_another_process(sim_env: SimEnv) -> None:
    """A process keeps device 1 busy and holds memory there; when it ends, all is given back."""
    env = sim_env(devices="count=2,overhead=256MiB")
    worker_code = (
        DRIVER_PRELUDE
        + """
import sys, threading
use_device(1)
allocate(1 << 30)
function = kernel()
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
launch(function, 50_000_000)
synchronize()
print("ready", flush=True)
while not stop.is_set():
    launch(function, 50_000_000)
    synchronize()
"""
    )
    observe = """
    def processes(h):
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        return sorted([p.pid, p.usedGpuMemory] for p in listed)

    result = {
        "processes": [processes(h) for h in handles],
        "processes_v2": [[p.pid, p.usedGpuMemory]
                         for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handles[1])],
        "used": [pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles],
        "used_v2": pynvml.nvmlDeviceGetMemoryInfo(handles[1], version=pynvml.nvmlMemory_v2).used,
        "gpu": [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles],
        "idle_samples": error(lambda: pynvml.nvmlDeviceGetProcessUtilization(handles[0], 0)),
    }
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handles[1], 0)
        result["samples"] = [[s.pid, s.smUtil] for s in samples]
    except pynvml.NVMLError_NotFound:
        result["samples"] = []
    """
    worker = subprocess.Popen(
        [sys.executable, "-c", worker_code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        time.sleep(1.1)  # a full utilization window of back-to-back kernels
        busy = query(observe, env)
    finally:
        worker.communicate(input="", timeout=30)
    assert worker.returncode == 0, worker.stderr

    held = GiB + 256 * MiB  # the allocation and one context
    assert busy["processes"] == [[], [[worker.pid, held]]]
    assert busy["processes_v2"] == [[worker.pid, held]]
    assert busy["used"] == [0, held]
    assert busy["used_v2"] == held
    assert busy["gpu"][0] == 0
    assert busy["gpu"][1] >= 80
    assert [pid for pid, _ in busy["samples"]] == [worker.pid]
    assert busy["samples"][0][1] >= 80
    assert busy["idle_samples"] == "NVMLError_NotFound"

    after = query(observe, env)
    assert after["processes"] == [[], []]
    assert after["used"] == [0, 0]


@needs_driver
def test_unversioned_process_query_uses_the_v1_layout(sim_env: SimEnv) -> None:
    result = query(
        """
        use_device(0)
        allocate(64 << 20)
        nvml = ctypes.CDLL("libnvidia-ml.so.1")

        class ProcessInfoV1(ctypes.Structure):
            _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

        count = ctypes.c_uint(0)
        get_processes = nvml.nvmlDeviceGetComputeRunningProcesses
        size_query = get_processes(handles[0], ctypes.byref(count), None)
        needed = count.value
        infos = (ProcessInfoV1 * 2)()
        count.value = 2
        listed = get_processes(handles[0], ctypes.byref(count), infos)
        result = {
            "size_query": [size_query, needed],
            "listed": [listed, count.value, infos[0].pid, infos[0].usedGpuMemory],
            "pid": os.getpid(),
            "null_infos": get_processes(handles[0], ctypes.byref(ctypes.c_uint(4)), None),
        }
        """,
        sim_env(devices="count=1,overhead=128MiB"),
        driver=True,
    )
    assert result["size_query"] == [7, 1]
    assert result["listed"] == [0, 1, result["pid"], 64 * MiB + 128 * MiB]
    assert result["null_infos"] == 2


def _official_nvml_header() -> Path | None:
    """nvml.h from an installed NVIDIA wheel (nvidia-nvml-dev, or a CUDA 13 wheel), if any."""
    for entry in sys.path:
        for header in sorted(Path(entry).glob("nvidia/*/include/nvml.h")):
            return header
    return None


LAYOUT_PROGRAM = """
#include <stddef.h>
#include <stdio.h>
#include HEADER
#define SIZE(t) printf("sizeof %s %zu\\n", #t, sizeof(t));
#define OFFSET(t, f) printf("offsetof %s.%s %zu\\n", #t, #f, offsetof(t, f));
#define VALUE(e) printf("value %s %lld\\n", #e, (long long)(e));
int main(void) {
    SIZE(nvmlPciInfo_t) OFFSET(nvmlPciInfo_t, domain) OFFSET(nvmlPciInfo_t, bus)
    OFFSET(nvmlPciInfo_t, device) OFFSET(nvmlPciInfo_t, pciDeviceId)
    OFFSET(nvmlPciInfo_t, pciSubSystemId) OFFSET(nvmlPciInfo_t, busId)
    SIZE(nvmlUtilization_t) OFFSET(nvmlUtilization_t, memory)
    SIZE(nvmlMemory_t) OFFSET(nvmlMemory_t, total) OFFSET(nvmlMemory_t, free)
    OFFSET(nvmlMemory_t, used)
    SIZE(nvmlMemory_v2_t) OFFSET(nvmlMemory_v2_t, total) OFFSET(nvmlMemory_v2_t, reserved)
    OFFSET(nvmlMemory_v2_t, free) OFFSET(nvmlMemory_v2_t, used) VALUE(nvmlMemory_v2)
    SIZE(nvmlProcessInfo_v1_t) OFFSET(nvmlProcessInfo_v1_t, usedGpuMemory)
    SIZE(nvmlProcessInfo_t) OFFSET(nvmlProcessInfo_t, usedGpuMemory)
    OFFSET(nvmlProcessInfo_t, gpuInstanceId) OFFSET(nvmlProcessInfo_t, computeInstanceId)
    SIZE(nvmlProcessUtilizationSample_t) OFFSET(nvmlProcessUtilizationSample_t, timeStamp)
    OFFSET(nvmlProcessUtilizationSample_t, smUtil) OFFSET(nvmlProcessUtilizationSample_t, decUtil)
    VALUE(NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE) VALUE(NVML_DEVICE_UUID_V2_BUFFER_SIZE)
    VALUE(NVML_DEVICE_NAME_V2_BUFFER_SIZE) VALUE(NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE)
    VALUE(NVML_TEMPERATURE_GPU_MAX) VALUE(NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    VALUE(NVML_CLOCK_VIDEO) VALUE(NVML_PSTATE_15) VALUE(NVML_PSTATE_UNKNOWN)
    VALUES
    return 0;
}
"""


@pytest.mark.skipif(
    _official_nvml_header() is None or shutil.which("cc") is None,
    reason="no official nvml.h (pip install nvidia-nvml-dev) or no C compiler",
)
def test_abi_matches_the_official_header(tmp_path: Path) -> None:
    official = _official_nvml_header()
    assert official is not None
    ours = ABI_HEADER.read_text()
    returns = re.findall(r"X\((NVML_\w+), -?\d+\)", ours)
    values = " ".join(f"VALUE({name})" for name in returns)
    program = tmp_path / "layout.c"
    program.write_text(LAYOUT_PROGRAM.replace("VALUES", values))
    outputs: list[str] = []
    for header, include in (("<nvml.h>", official.parent), ('"nvml_abi.h"', ABI_HEADER.parent)):
        binary = tmp_path / f"layout{len(outputs)}"
        subprocess.run(
            [
                "cc",
                "-std=c11",
                "-w",
                f"-DHEADER={header}",
                f"-I{include}",
                str(program),
                "-o",
                str(binary),
            ],
            check=True,
        )
        run = subprocess.run([str(binary)], check=True, capture_output=True, text=True)
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1]

    # Our prototypes, declared again over the official types: any difference fails to compile.
    prototypes = tmp_path / "prototypes.c"
    prototypes.write_text(
        "#define NVML_NO_UNVERSIONED_FUNC_DEFS\n#include <nvml.h>\n"
        + _api_table()
        + "#define DECLARE(symbol, type, params, args) type symbol params;\n"
        + "VGPU_NVML_API(DECLARE)\n"
    )
    subprocess.run(
        [
            "cc",
            "-std=c11",
            "-Wall",
            "-Werror",
            "-Wno-deprecated-declarations",
            f"-I{official.parent}",
            "-c",
            str(prototypes),
            "-o",
            str(tmp_path / "prototypes.o"),
        ],
        check=True,
    )
