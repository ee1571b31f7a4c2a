"""The NVML process lists under libcuda_limiter.so: on a GPU the pod's region gives a limit, a pod
sees its own processes only (nvidia-smi in a pod must not list another tenant's processes and
their memory); on any other GPU the lists are the driver's. Every version of each query keeps
NVML's calling convention: *infoCount in and out, NVML_ERROR_INSUFFICIENT_SIZE with the count
needed, and NULL infos with a count of 0 to ask for the count."""

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.limiter.conftest import WORKLOAD, LimitedEnv, run

GiB = 1 << 30

QUERIES = {
    "nvmlDeviceGetComputeRunningProcesses": 1,
    "nvmlDeviceGetComputeRunningProcesses_v2": 2,
    "nvmlDeviceGetComputeRunningProcesses_v3": 2,
    "nvmlDeviceGetGraphicsRunningProcesses": 1,
    "nvmlDeviceGetGraphicsRunningProcesses_v2": 2,
    "nvmlDeviceGetGraphicsRunningProcesses_v3": 2,
    "nvmlDeviceGetMPSComputeRunningProcesses": 1,
    "nvmlDeviceGetMPSComputeRunningProcesses_v2": 2,
    "nvmlDeviceGetMPSComputeRunningProcesses_v3": 2,
}

# For each device and query: the count a NULL buffer asks for, what a buffer one short gives,
# and the full list (pid, memory, and the instance ids of the v2 layout).
LISTER = """
import ctypes, json, sys, pynvml
QUERIES = json.loads(sys.argv[1])
class V1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]
class V2(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]
assert ctypes.sizeof(V1) == 16 and ctypes.sizeof(V2) == 24
pynvml.nvmlInit()
report = {}
for index in range(2):
    device = pynvml.nvmlDeviceGetHandleByIndex(index)
    for name, version in QUERIES.items():
        query = pynvml._nvmlGetFunctionPointer(name)
        layout = V1 if version == 1 else V2
        count = ctypes.c_uint(0)
        asked = query(device, ctypes.byref(count), None)
        needed = count.value
        short = None
        if needed > 0:
            buffer = (layout * needed)()
            count = ctypes.c_uint(needed - 1)
            short = [query(device, ctypes.byref(count), buffer), count.value]
        # Room to spare: the count says how many were written.
        buffer = (layout * (needed + 4))()
        for entry in buffer:
            entry.pid = 0xDEAD
        count = ctypes.c_uint(needed + 4)
        result = query(device, ctypes.byref(count), buffer)
        listed = [[entry.pid, entry.usedGpuMemory] +
                  ([] if version == 1 else [entry.gpuInstanceId, entry.computeInstanceId])
                  for entry in buffer[:count.value]]
        untouched = all(entry.pid == 0xDEAD for entry in buffer[count.value:])
        report[f"{index} {name}"] = {
            "asked": [asked, needed], "short": short, "result": result,
            "listed": listed, "untouched": untouched,
        }
    # The detail list (nvidia-smi's since R550), every mode; and a version not known.
    for mode in range(3):
        found = pynvml.nvmlDeviceGetRunningProcessDetailList(
            device, pynvml.nvmlProcessDetailList_v1, mode)
        report[f"{index} detail {mode}"] = sorted([p.pid, p.usedGpuMemory] for p in found)
    unknown = pynvml.c_nvmlProcessDetailList_t(version=0x2000018, mode=0)
    report[f"{index} detail version 2"] = pynvml._nvmlGetFunctionPointer(
        "nvmlDeviceGetRunningProcessDetailList")(device, ctypes.byref(unknown))
print(json.dumps(report))
"""


def lists(environment: dict[str, str]) -> dict[str, Any]:
    result = run([sys.executable, "-c", LISTER, json.dumps(QUERIES)], environment)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


@contextmanager
def holding(environment: dict[str, str], device: int) -> Iterator[int]:
    """A process holding 1 GiB on `device` until the block ends; its pid."""
    holder = subprocess.Popen(
        [WORKLOAD, "--kernels", "1", "--device", str(device), "--alloc", str(GiB), "--hold", "60"],
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        ready = json.loads(holder.stdout.readline())
        assert ready.get("error") is None, ready
        yield holder.pid
    finally:
        holder.kill()
        holder.wait(timeout=10)


def pids(entry: dict[str, Any]) -> set[int]:
    return {listed[0] for listed in entry["listed"]}


def test_a_pod_lists_only_its_own_processes_on_its_gpu(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    # Two pods share GPU 0, each with a limit there; pod A has no limit on GPU 1.
    pod_a = limited_env('{"0": "4GiB"}')
    pod_b = limited_env('{"0": "4GiB"}', SHM_PATH=str(tmp_path / "pod-b"))
    with (
        holding(pod_a, 0) as a0,
        holding(pod_a, 0) as a1,
        holding(pod_b, 0) as b0,
        holding(pod_b, 1) as b1,
    ):
        node = lists(limited_env(preload=False))
        seen_a = lists(pod_a)
        seen_b = lists(pod_b)
    # Without the limiter, the driver's lists: every process of the node.
    assert pids(node["0 nvmlDeviceGetComputeRunningProcesses_v3"]) == {a0, a1, b0}
    assert pids(node["1 nvmlDeviceGetComputeRunningProcesses_v3"]) == {b1}
    for name, version in QUERIES.items():
        compute = "Compute" in name and "MPS" not in name
        for seen, own in ((seen_a, {a0, a1}), (seen_b, {b0})):
            entry = seen[f"0 {name}"]
            expected = own if compute else set()
            assert pids(entry) == expected, (name, entry)
            assert entry["result"] == 0 and entry["untouched"], (name, entry)
            # The count asked for is the pod's, and a buffer one short is refused with it.
            assert entry["asked"] == [7 if expected else 0, len(expected)], (name, entry)
            assert entry["short"] == ([7, len(expected)] if expected else None), (name, entry)
            # Each entry is the driver's own (memory, and the instance ids outside MIG).
            driver = {listed[0]: listed for listed in node[f"0 {name}"]["listed"]}
            assert all(listed == driver[listed[0]] for listed in entry["listed"]), name
            if version == 2 and expected:
                assert entry["listed"][0][2:] == [0xFFFFFFFF, 0xFFFFFFFF]
        # GPU 1 has no limit in pod A's region: passed through, pod B's process included.
        assert seen_a[f"1 {name}"] == node[f"1 {name}"], name
    # The detail list nvidia-smi reads: the same, with the driver's entries.
    driver = {listed[0]: listed for listed in node["0 detail 0"]}
    assert set(driver) == {a0, a1, b0}
    for seen, own in ((seen_a, {a0, a1}), (seen_b, {b0})):
        assert seen["0 detail 0"] == sorted(driver[pid] for pid in own)
        assert seen["0 detail 1"] == seen["0 detail 2"] == []
        assert seen["0 detail version 2"] == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert seen_a["1 detail 0"] == node["1 detail 0"] == [[b1, node["1 detail 0"][0][1]]]


def test_a_list_longer_than_the_callers_room_is_read_whole_and_filtered(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    """The driver's list holds more processes than the limiter reads at first (32): it asks for
    the room the driver says it needs, and the pod still sees its own two."""
    pod_a = limited_env('{"0": "4GiB"}')
    pod_b = limited_env(SHM_PATH=str(tmp_path / "pod-b"))
    others = [
        subprocess.Popen(
            [WORKLOAD, "--kernels", "1", "--alloc", str(1 << 20), "--hold", "60"],
            env=pod_b,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(40)
    ]
    try:
        for other in others:
            assert other.stdout is not None
            assert json.loads(other.stdout.readline()).get("error") is None
        with holding(pod_a, 0) as a0, holding(pod_a, 0) as a1:
            node = lists(limited_env(preload=False))
            seen = lists(pod_a)
    finally:
        for other in others:
            other.kill()
            other.wait(timeout=10)
    assert len(node["0 nvmlDeviceGetComputeRunningProcesses"]["listed"]) == 42
    for name in ("_v2", "_v3", ""):
        entry = seen[f"0 nvmlDeviceGetComputeRunningProcesses{name}"]
        assert entry["asked"] == [7, 2] and entry["short"] == [7, 2], entry
        assert pids(entry) == {a0, a1} and entry["result"] == 0, entry
