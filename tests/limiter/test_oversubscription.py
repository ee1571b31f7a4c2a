"""Memory oversubscription on the simulated GPU: past its limit, a pod with oversubscription on is
served host-backed managed memory, charged apart from its device memory; the paths that cannot
fall back are refused as before; frees, context teardown and dead processes give the right bytes
back; without the flag the limit is an out-of-memory error as always."""

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from vgpu_limiter import region as regions

from tests.limiter.conftest import WORKLOAD, LimitedEnv, run

GiB = 1 << 30
MiB = 1 << 20
UUID = "GPU-5157a1e0-0000-4000-8000-000000000001"  # device 0 of the simulated node
OUT_OF_MEMORY = 2

# A driver-API program that runs steps named on its command line and prints one JSON line per
# step: the result code and what the pod region says afterwards.
PROGRAM = textwrap.dedent(
    """
    import ctypes, json, os, sys
    from vgpu_limiter import region as regions
    cu = ctypes.CDLL("libcuda.so.1")
    u64, size = ctypes.c_uint64, ctypes.c_size_t
    assert cu.cuInit(0) == 0
    context = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
    assert cu.cuCtxSetCurrent(context) == 0
    pod = regions.open_region(sys.argv[1], writable=False)
    held = {}

    def alloc(mib):
        pointer = u64()
        code = cu.cuMemAlloc_v2(ctypes.byref(pointer), size(mib << 20))
        return code, pointer.value

    def managed(mib):
        pointer = u64()
        code = cu.cuMemAllocManaged(ctypes.byref(pointer), size(mib << 20), 1)
        return code, pointer.value

    def pitch(mib):
        pointer, pitch = u64(), size()
        code = cu.cuMemAllocPitch_v2(ctypes.byref(pointer), ctypes.byref(pitch), size(1 << 20),
                                     size(mib), 4)
        return code, pointer.value

    def legacy(mib):
        pointer = ctypes.c_uint32()
        return cu.cuMemAlloc(ctypes.byref(pointer), ctypes.c_uint(mib << 20)), pointer.value

    def pool(mib):
        pointer = u64()
        code = cu.cuMemAllocAsync(ctypes.byref(pointer), size(mib << 20), None)
        return code, pointer.value

    class Prop(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("handles", ctypes.c_int), ("location_type",
                    ctypes.c_int), ("location_id", ctypes.c_int), ("win32", ctypes.c_void_p),
                    ("flags", ctypes.c_ubyte * 8)]

    def vmm(mib):
        handle, prop = u64(), Prop(type=1, location_type=1, location_id=0)
        return cu.cuMemCreate(ctypes.byref(handle), size(mib << 20), ctypes.byref(prop), 0), 0

    class Array(ctypes.Structure):
        _fields_ = [("width", size), ("height", size), ("format", ctypes.c_int),
                    ("channels", ctypes.c_uint)]

    def array(mib):
        handle = ctypes.c_void_p()
        desc = Array(width=mib << 16, height=16, format=0x01, channels=1)  # 1-byte texels
        return cu.cuArrayCreate_v2(ctypes.byref(handle), ctypes.byref(desc)), 0

    def free(name):
        return cu.cuMemFree_v2(u64(held.pop(name))), 0

    def free_async(name):
        return cu.cuMemFreeAsync(u64(held.pop(name)), None), 0

    def touch(name):
        # Host-backed memory is host memory on the simulated GPU: the program can write it.
        ctypes.memset(held[name], 0x5A, 4096)
        return 0, 0

    def info():
        free, total = size(), size()
        assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
        return {"free": free.value, "total": total.value}

    def destroy_context(_):
        fresh = ctypes.c_void_p()
        assert cu.cuCtxCreate_v2(ctypes.byref(fresh), 0, 0) == 0
        assert cu.cuCtxSetCurrent(fresh) == 0
        code, _ = alloc(2048)  # past the limit whatever the pod holds
        assert code == 0
        assert cu.cuCtxDestroy_v2(fresh) == 0
        assert cu.cuCtxSetCurrent(context) == 0
        return 0, 0

    steps = {"alloc": alloc, "managed": managed, "pitch": pitch, "legacy": legacy,
             "pool": pool, "vmm": vmm, "array": array, "free": free, "free_async": free_async,
             "touch": touch, "destroy_context": destroy_context}
    for step in sys.argv[2:]:
        if step == "hold":
            print(json.dumps({"step": "hold"}), flush=True)
            sys.stdin.read()
            continue
        kind, _, argument = step.partition(":")
        name = argument
        if kind in ("alloc", "managed", "pitch", "legacy", "pool", "vmm", "array"):
            name, _, mib = argument.partition("=")
            code, pointer = steps[kind](int(mib))
            if code == 0 and pointer:
                held[name] = pointer
        else:
            code, _ = steps[kind](name)
        device = pod.devices[0]
        mine = [p for p in pod.processes if p.pid == os.getpid()][0]
        print(json.dumps({"step": step, "code": code, "device": device.memory_used,
                          "host": device.host_memory_used,
                          "mine": mine.memory[device.uuid],
                          "mine_host": mine.host_memory[device.uuid]} | info()), flush=True)
    """
)


def make_pod(folder: Path, oversubscribe: bool, limit: int = GiB) -> None:
    flags = regions.DEVICE_OVERSUBSCRIBE if oversubscribe else 0
    spec = regions.DeviceLimits(limit, 0, 0, flags)
    folder.mkdir(parents=True, exist_ok=True)
    regions.create_region(folder / "shm", "team", "train", {UUID: spec}).close()


def steps(environment: dict[str, str], folder: Path, *names: str) -> list[dict[str, int]]:
    result = run([sys.executable, "-c", PROGRAM, str(folder / "shm"), *names], environment)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def oversubscribed(limited_env: LimitedEnv, pod_folder: Path) -> dict[str, str]:
    make_pod(pod_folder, oversubscribe=True)
    return limited_env(TF_CUDA_CONTEXT_OVERHEAD="256MiB")


def test_allocations_past_the_limit_are_host_backed_and_freed_as_such(
    oversubscribed: dict[str, str], pod_folder: Path
) -> None:
    first, second, third, touched, free_host, free_device, free_managed = steps(
        oversubscribed,
        pod_folder,
        "alloc:a=512",  # fits: 256 MiB context + 512 MiB
        "alloc:b=512",  # would pass 1 GiB: host-backed
        "managed:c=300",  # the program's own managed memory past the limit: host-backed too
        "touch:b",
        "free:b",
        "free:a",
        "free:c",
    )
    assert (first["code"], first["device"], first["host"]) == (0, 768 * MiB, 0)
    assert (second["code"], second["device"], second["host"]) == (0, 768 * MiB, 512 * MiB)
    assert (second["mine"], second["mine_host"]) == (768 * MiB, 512 * MiB)
    assert third["host"] == 512 * MiB + 300 * MiB
    # The view stays the limit and the device-resident usage.
    assert (second["total"], second["free"]) == (GiB, 256 * MiB)
    assert touched["code"] == 0
    assert (free_host["code"], free_host["device"], free_host["host"]) == (0, 768 * MiB, 300 * MiB)
    assert (free_device["device"], free_device["host"]) == (256 * MiB, 300 * MiB)
    assert (free_managed["device"], free_managed["host"], free_managed["mine_host"]) == (
        256 * MiB,
        0,
        0,
    )


def test_a_managed_allocation_within_the_limit_stays_device_memory(
    oversubscribed: dict[str, str], pod_folder: Path
) -> None:
    (managed,) = steps(oversubscribed, pod_folder, "managed:m=256")
    assert (managed["code"], managed["device"], managed["host"]) == (0, 512 * MiB, 0)


def test_the_device_holds_no_more_than_the_limit(limited_env: LimitedEnv, pod_folder: Path) -> None:
    make_pod(pod_folder, oversubscribe=True)
    # The limiter charges the simulated context what it really takes (512 MiB).
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PROGRAM,
            str(pod_folder / "shm"),
            "alloc:a=400",
            "alloc:b=2048",
            "hold",
        ],
        env=limited_env(),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        lines = [json.loads(holder.stdout.readline()) for _ in range(3)]
        assert [line.get("code") for line in lines[:2]] == [0, 0]
        assert lines[1]["host"] == 2 * GiB
        # What the simulated device really holds for the process, seen without the limiter.
        probe = textwrap.dedent(
            """
            import json, pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            print(json.dumps({p.pid: p.usedGpuMemory for p in running}))
            """
        )
        seen = run([sys.executable, "-c", probe], limited_env(preload=False))
        assert seen.returncode == 0, seen.stderr
        used = json.loads(seen.stdout)
        assert used[str(holder.pid)] <= GiB
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_a_stream_ordered_free_gives_host_backed_memory_back_as_such(
    oversubscribed: dict[str, str], pod_folder: Path
) -> None:
    _, host_backed, free_host, free_device = steps(
        oversubscribed, pod_folder, "alloc:a=512", "alloc:b=512", "free_async:b", "free_async:a"
    )
    assert (host_backed["device"], host_backed["host"]) == (768 * MiB, 512 * MiB)
    assert (free_host["code"], free_host["device"], free_host["host"]) == (0, 768 * MiB, 0)
    assert (free_device["code"], free_device["device"], free_device["host"]) == (0, 256 * MiB, 0)


@pytest.mark.parametrize("path", ["pitch", "legacy", "pool", "vmm", "array"])
def test_paths_that_cannot_fall_back_are_refused(
    oversubscribed: dict[str, str], pod_folder: Path, path: str
) -> None:
    (refused,) = steps(oversubscribed, pod_folder, f"{path}:x=1024")
    assert refused["code"] == OUT_OF_MEMORY
    assert (refused["device"], refused["host"]) == (256 * MiB, 0)


def test_without_oversubscription_the_limit_is_out_of_memory(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    make_pod(pod_folder, oversubscribe=False)
    environment = limited_env(TF_CUDA_CONTEXT_OVERHEAD="256MiB")
    fits, over, managed = steps(
        environment, pod_folder, "alloc:a=512", "alloc:b=512", "managed:c=512"
    )
    assert fits["code"] == 0
    assert (over["code"], over["device"], over["host"]) == (OUT_OF_MEMORY, 768 * MiB, 0)
    assert (managed["code"], managed["host"]) == (OUT_OF_MEMORY, 0)


def test_turning_oversubscription_on_live_takes_effect_at_the_next_allocation(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    make_pod(pod_folder, oversubscribe=False)
    environment = limited_env(TF_CUDA_CONTEXT_OVERHEAD="256MiB")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PROGRAM,
            str(pod_folder / "shm"),
            "alloc:a=1024",
            "hold",
            "alloc:b=1024",
        ],
        env=environment,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None and holder.stdin is not None
    assert json.loads(holder.stdout.readline())["code"] == OUT_OF_MEMORY
    holder.stdout.readline()  # holding
    with regions.open_region(pod_folder / "shm") as pod:
        pod.set_limits(UUID, device_flags=regions.DEVICE_OVERSUBSCRIBE)
    output, _ = holder.communicate("", timeout=30)
    after = json.loads(output)
    assert (after["code"], after["host"]) == (0, GiB)


def test_a_destroyed_context_gives_its_host_backed_bytes_back(
    oversubscribed: dict[str, str], pod_folder: Path
) -> None:
    (after,) = steps(oversubscribed, pod_folder, "destroy_context:_")
    assert (after["code"], after["device"], after["host"], after["mine_host"]) == (
        0,
        256 * MiB,
        0,
        0,
    )


def test_a_killed_process_gives_its_host_backed_bytes_back(
    oversubscribed: dict[str, str], pod_folder: Path
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(pod_folder / "shm"), "alloc:a=3072", "hold"],
        env=oversubscribed,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None
    held = json.loads(holder.stdout.readline())
    assert (held["code"], held["host"]) == (0, 3 * GiB)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    with regions.open_region(pod_folder / "shm") as pod:
        assert pod.device(UUID).host_memory_used == 3 * GiB
    # The next process of the pod sweeps the dead one's slot at its first memory call.
    (after,) = steps(oversubscribed, pod_folder, "alloc:a=256")
    assert (after["code"], after["device"], after["host"]) == (0, 512 * MiB, 0)


def test_the_daemon_reclaims_host_backed_bytes_of_a_dead_process(
    oversubscribed: dict[str, str], pod_folder: Path
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(pod_folder / "shm"), "alloc:a=2048", "hold"],
        env=oversubscribed,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None
    assert json.loads(holder.stdout.readline())["host"] == 2 * GiB
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    with regions.open_region(pod_folder / "shm") as pod:
        (gone,) = pod.reap()
        assert gone.host_memory[UUID] == 2 * GiB
        device = pod.device(UUID)
        assert (device.memory_used, device.host_memory_used) == (0, 0)


@pytest.mark.parametrize("path", ["linked", "dlopen", "procaddress"])
def test_every_call_path_oversubscribes(
    oversubscribed: dict[str, str], pod_folder: Path, path: str
) -> None:
    holder = subprocess.Popen(
        [WORKLOAD, "--kernels", "1", "--path", path, "--alloc", "2GiB", "--hold", "60"],
        env=oversubscribed,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        report = json.loads(holder.stdout.readline())
        assert report.get("error") is None, report
        assert (report["total_bytes"], report["free_bytes"]) == (GiB, GiB - 256 * MiB)
        with regions.open_region(pod_folder / "shm") as pod:
            device = pod.device(UUID)
            assert (device.memory_used, device.host_memory_used) == (256 * MiB, 2 * GiB)
    finally:
        holder.send_signal(signal.SIGTERM)  # --hold ends and the workload frees
        holder.communicate(timeout=30)
    with regions.open_region(pod_folder / "shm") as pod:
        assert pod.device(UUID).host_memory_used == 0
