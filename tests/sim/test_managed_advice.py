"""Managed memory and cuMemAdvise on the simulated GPU: resident on the device until advice
prefers the host for the whole allocation, back when the preference returns to the device."""

import json
import subprocess
import sys
import textwrap

from tests.sim.conftest import SimEnv
from tests.sim.workload_runner import GiB, MiB

PROGRAM = textwrap.dedent(
    """
    import ctypes, json
    cu = ctypes.CDLL("libcuda.so.1")
    u64, size = ctypes.c_uint64, ctypes.c_size_t

    class Location(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    HOST, DEVICE = Location(2, 0), Location(1, 0)
    PREFER, UNPREFER, ACCESSED_BY, BAD = 3, 4, 5, 9
    assert cu.cuInit(0) == 0
    context = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
    assert cu.cuCtxSetCurrent(context) == 0

    def used():
        free, total = size(), size()
        assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
        return (total.value - free.value) >> 20

    def advise(pointer, count, advice, location):
        return cu.cuMemAdvise_v2(u64(pointer), size(count), advice, location)

    report = {"context": used()}
    managed, plain = u64(), u64()
    assert cu.cuMemAllocManaged(ctypes.byref(managed), size(1 << 30), 1) == 0
    assert cu.cuMemAlloc_v2(ctypes.byref(plain), size(64 << 20)) == 0
    report["allocated"] = used()
    report["part"] = advise(managed.value, 1 << 20, PREFER, HOST)
    report["after_part"] = used()
    report["whole"] = advise(managed.value, 1 << 30, PREFER, HOST)
    report["accessed_by"] = advise(managed.value, 1 << 30, ACCESSED_BY, DEVICE)
    report["on_host"] = used()
    report["legacy_back"] = cu.cuMemAdvise(u64(managed.value), size(1 << 30), UNPREFER, 0)
    report["back"] = used()
    report["legacy_host"] = cu.cuMemAdvise(u64(managed.value), size(1 << 30), PREFER, -1)
    report["host_again"] = used()
    report["past_end"] = advise(managed.value, (1 << 30) + 1, PREFER, HOST)
    report["not_managed"] = advise(plain.value, 64 << 20, PREFER, HOST)
    report["bad_advice"] = advise(managed.value, 1 << 30, BAD, HOST)
    report["bad_device"] = advise(managed.value, 1 << 30, PREFER, Location(1, 7))
    ctypes.memset(managed.value, 1, 4096)  # host memory the program may touch
    assert cu.cuMemFree_v2(managed) == 0
    report["freed"] = used()
    print(json.dumps(report))
    """
)


def test_advice_moves_managed_memory_between_the_device_and_the_host(sim_env: SimEnv) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        env=sim_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    context = report["context"]
    assert report["allocated"] == context + GiB // MiB + 64
    assert (report["part"], report["after_part"]) == (0, report["allocated"])
    assert (report["whole"], report["accessed_by"], report["on_host"]) == (0, 0, context + 64)
    assert (report["legacy_back"], report["back"]) == (0, report["allocated"])
    assert (report["legacy_host"], report["host_again"]) == (0, context + 64)
    invalid_value = 1
    assert [report[key] for key in ("past_end", "not_managed", "bad_advice", "bad_device")] == [
        invalid_value
    ] * 4
    assert report["freed"] == context + 64
