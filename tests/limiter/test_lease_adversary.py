"""A tenant that scribbles the device lease: a fixed owner, activity and yield_until in the far
future, a huge waiter count and a boost of 2 in the lease's old boost words. A 50 %-limited pod
on the same GPU must take about the time it takes without that tenant: the worst a lease writer
can do to others is to run its own work unlimited."""

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from vgpu_limiter.lease import DeviceLease, lease_path
from vgpu_limiter.region import ffi

from tests.limiter.conftest import WORKLOAD, LimitedEnv, run

SIM_GPU0 = "GPU-5157a1e0-0000-4000-8000-000000000001"  # the simulator's first GPU
KERNELS, KERNEL_US = 400, 1000  # 0.4 s of GPU time: 0.8 s at 50 %

# Byte offsets of the words the attacker writes, from the C header through cffi.
_WORDS = {
    name: ffi.offsetof("struct vgpu_device_lease", name)
    for name in (
        "owner",
        "activity_ns",
        "waiters",
        "yield_until_ns",
        "unused_boost",
        "unused_boost_ns",
    )
}
SCRIBBLER = f"""
import mmap, os, struct, sys, time
words = {_WORDS!r}
fd = os.open(sys.argv[1], os.O_RDWR)
view = mmap.mmap(fd, 128)
print("ready", flush=True)
while True:
    far = time.monotonic_ns() + 3600 * 10**9
    fresh = time.monotonic_ns()
    struct.pack_into("<Q", view, words["owner"], 0x5EED5EED5EED5EED)
    struct.pack_into("<Q", view, words["activity_ns"], fresh if sys.argv[2] == "fresh" else far)
    struct.pack_into("<Q", view, words["yield_until_ns"], far)
    struct.pack_into("<Q", view, words["waiters"], 1 << 62)
    struct.pack_into("<I", view, words["unused_boost"], 20000)  # version 1's boost: 2.0
    struct.pack_into("<Q", view, words["unused_boost_ns"], time.monotonic_ns())
    time.sleep(0.001)
"""


def victim(environment: dict[str, str], *work: str) -> tuple[float, float]:
    """Wall time and share of the GPU (percent) of a workload at a 50 % limit."""
    environment = environment | {"TENSOR_FUSION_CUDA_UP_LIMIT": '{"0": 50}'}
    started = time.monotonic()
    result = run([WORKLOAD, "--kernel-us", str(KERNEL_US), *work], environment, timeout=120)
    elapsed = time.monotonic() - started
    report = json.loads(result.stdout)
    assert report.get("error") is None, report
    return elapsed, 100 * float(report["achieved_kernels_per_s"]) * KERNEL_US / 1e6


@contextmanager
def scribbler(environment: dict[str, str], activity: str) -> Iterator[None]:
    path = lease_path(environment["SHM_BASE_PATH"], SIM_GPU0)
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIBBLER, str(path), activity], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        yield
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def environment(limited_env: LimitedEnv, tmp_path: Path) -> dict[str, str]:
    return limited_env(SHM_BASE_PATH=str(tmp_path / "base"), SHM_PATH=str(tmp_path / "victim"))


@pytest.mark.parametrize("activity", ["fresh", "future"])
def test_a_lease_scribbler_costs_a_paced_pod_little(
    environment: dict[str, str], activity: str
) -> None:
    """Before the lease was made robust, a fresh activity stalled the victim past 120 s."""
    work = ("--kernels", str(KERNELS))
    alone, _ = victim(environment, *work)  # also makes the lease file
    with scribbler(environment, activity):
        attacked, _ = victim(environment, *work)
    print(f"50 % pod, 0.4 s of GPU work: {alone:.2f} s alone, {attacked:.2f} s attacked")
    # A holder that never releases costs one wait of VGPU_LEASE_HOLD_NS, then the lease is not
    # waited for during a second or more; the scribbler's CPU slows a loaded machine too.
    assert attacked < alone * 1.5 + 0.5, (alone, attacked)


def test_a_tenant_written_boost_is_not_charged(environment: dict[str, str]) -> None:
    """A boost of 2 where version 1 kept it would halve the pod's share: it stays at 50 %."""
    DeviceLease.open(environment["SHM_BASE_PATH"], SIM_GPU0).close()  # the files, as the daemon
    with scribbler(environment, "future"):
        _, got = victim(environment, "--duration", "2")
    # Charged, it would give 25 %; a busy machine takes a few points off the share, never adds.
    assert 40 < got < 53, got
