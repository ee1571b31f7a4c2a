"""Memory limits of libcuda_limiter.so on the simulated GPU: every allocation path, every call
path, concurrency, dead processes, fork, the virtual view and bad configurations."""

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from vgpu_limiter import library_path

from tests.limiter.conftest import WORKLOAD, LimitedEnv, build_program, build_unit_test, run

GiB = 1 << 30
MiB = 1 << 20
PATHS = ["linked", "dlopen", "procaddress"]


def workload(environment: dict[str, str], *options: str) -> dict[str, object]:
    result = run([WORKLOAD, "--kernels", "1", *options], environment)
    report: dict[str, object] = json.loads(result.stdout)
    return report


@pytest.mark.parametrize("path", PATHS)
def test_every_allocation_api_is_charged_refused_and_given_back(
    limited_env: LimitedEnv, tmp_path: Path, path: str
) -> None:
    program = build_program("limiter_paths", tmp_path)
    environment = limited_env('{"0": "1GiB"}', TF_CUDA_CONTEXT_OVERHEAD="256MiB")
    result = run([str(program), path], environment)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("passed, 0 failed")


@pytest.mark.parametrize("path", PATHS)
def test_limit_is_exact_at_the_boundary_on_every_call_path(
    limited_env: LimitedEnv, path: str
) -> None:
    environment = limited_env('{"0": "4GiB"}')
    fits = workload(environment, "--path", path, "--alloc", str(4 * GiB - 512 * MiB))
    assert fits.get("error") is None, fits
    assert fits["total_bytes"] == 4 * GiB
    assert fits["free_bytes"] == 0
    over = workload(environment, "--path", path, "--alloc", str(4 * GiB - 512 * MiB + 1))
    assert over["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"


def test_index_and_uuid_keys_and_unlimited_devices(limited_env: LimitedEnv, tmp_path: Path) -> None:
    uuid = "GPU-5157A1E0-0000-4000-8000-000000000002"  # device 1 of the default node, any case
    environment = limited_env(f'{{"0": "2GiB", "{uuid}": "3GiB"}}')
    assert workload(environment, "--device", "0")["total_bytes"] == 2 * GiB
    assert workload(environment, "--device", "1")["total_bytes"] == 3 * GiB
    # Another pod: its region has no limit for device 1 (a pod's region keeps its limits).
    unlimited = limited_env('{"0": "2GiB"}', SHM_PATH=str(tmp_path / "other-pod"))
    assert workload(unlimited, "--device", "1")["total_bytes"] == 80 * GiB


def test_uuid_keys_follow_the_physical_gpu_through_cuda_visible_devices(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    uuid = "GPU-5157a1e0-0000-4000-8000-000000000002"
    environment = limited_env(f'{{"{uuid}": "3GiB"}}', CUDA_VISIBLE_DEVICES="1")
    assert workload(environment, "--device", "0")["total_bytes"] == 3 * GiB
    # An index means the ordinal the program sees: here physical device 1 (in a fresh pod).
    by_index = limited_env(
        '{"0": "2GiB"}', CUDA_VISIBLE_DEVICES="1", SHM_PATH=str(tmp_path / "other-pod")
    )
    assert workload(by_index, "--device", "0")["total_bytes"] == 2 * GiB


ALLOCATOR = textwrap.dedent(
    """
    import ctypes, json, sys, threading
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    context = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
    print("ready", flush=True)
    sys.stdin.readline()  # start together with the other process
    held, lock = [], threading.Lock()
    def allocate():
        assert cu.cuCtxSetCurrent(context) == 0
        while True:
            pointer = ctypes.c_uint64()
            if cu.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(64 << 20)) != 0:
                return
            with lock:
                held.append(pointer.value)
    threads = [threading.Thread(target=allocate) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"chunks": len(held)}), flush=True)
    sys.stdin.read()
    """
)

PROCESSES = textwrap.dedent(
    """
    import json, pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    print(json.dumps({
        "processes": {p.pid: p.usedGpuMemory for p in running},
        "total": pynvml.nvmlDeviceGetMemoryInfo(handle).total,
        "used": pynvml.nvmlDeviceGetMemoryInfo(handle).used,
    }))
    """
)


def nvml(environment: dict[str, str]) -> dict[str, object]:
    result = run([sys.executable, "-c", PROCESSES], environment)
    assert result.returncode == 0, result.stderr
    report: dict[str, object] = json.loads(result.stdout)
    return report


def test_eight_threads_in_two_processes_never_pass_the_limit(limited_env: LimitedEnv) -> None:
    environment = limited_env('{"0": "4GiB"}')
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", ALLOCATOR],
            env=environment,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        chunks = [
            json.loads(worker.stdout.readline())["chunks"] for worker in workers if worker.stdout
        ]
        # Two contexts of 512 MiB, the rest in 64 MiB chunks: exactly 48 fit, never one more.
        assert sum(chunks) == (4 * GiB - 2 * 512 * MiB) // (64 * MiB)
        # What the device really holds for the pod, seen without the limiter.
        seen = nvml(limited_env(preload=False))
        processes = seen["processes"]
        assert isinstance(processes, dict)
        assert sum(processes.values()) <= 4 * GiB
        assert sorted(int(pid) for pid in processes) == sorted(worker.pid for worker in workers)
    finally:
        for worker in workers:
            worker.communicate(timeout=30)


def test_a_killed_process_is_gone_from_the_view_within_two_seconds(
    limited_env: LimitedEnv,
) -> None:
    environment = limited_env('{"0": "4GiB"}')
    holder = subprocess.Popen(
        [WORKLOAD, "--kernels", "1", "--alloc", "2GiB", "--hold", "60"],
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    holder.stdout.readline()
    assert nvml(environment)["used"] == 2 * GiB + 512 * MiB
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    time.sleep(1.1)  # the sweep runs at most once a second per process
    assert nvml(environment)["used"] == 0


def test_a_killed_process_gives_its_memory_back(limited_env: LimitedEnv) -> None:
    environment = limited_env('{"0": "4GiB"}')
    holder = subprocess.Popen(
        [WORKLOAD, "--kernels", "1", "--alloc", "3GiB", "--hold", "60"],
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert json.loads(holder.stdout.readline()).get("error") is None
        assert workload(environment, "--alloc", "1GiB")["error"] == (
            "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
        )
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        started = time.monotonic()
        report = workload(environment, "--alloc", "3GiB")
        assert report.get("error") is None, report
        assert time.monotonic() - started < 2
    finally:
        holder.kill()


FORKER = textwrap.dedent(
    """
    import ctypes, json, os
    cu = ctypes.CDLL("libcuda.so.1")
    def used():
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
        return (total.value - free.value) >> 20
    def allocate(mib):
        pointer = ctypes.c_uint64()
        return cu.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(mib << 20))
    assert cu.cuInit(0) == 0
    context = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
    assert cu.cuCtxSetCurrent(context) == 0
    assert allocate(100) == 0
    child = os.fork()
    if child == 0:
        os._exit(allocate(100) or (0 if used() == 712 else 3))
    _, status = os.waitpid(child, 0)
    # The child's slot is reclaimed when the pod needs the room; the parent's stays.
    print(json.dumps({"child": os.waitstatus_to_exitcode(status), "after": used(),
                      "rest": allocate(1024 - 512 - 100), "more": allocate(2)}))
    """
)


def test_a_forked_child_has_its_own_slot(limited_env: LimitedEnv) -> None:
    result = run([sys.executable, "-c", FORKER], limited_env('{"0": "1GiB"}'))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {"child": 0, "after": 712, "rest": 0, "more": 2}


def test_nvml_shows_the_pod_under_the_limiter_and_the_truth_without(
    limited_env: LimitedEnv,
) -> None:
    environment = limited_env('{"0": "4GiB"}')
    holder = subprocess.Popen(
        [WORKLOAD, "--kernels", "1", "--alloc", "1GiB", "--hold", "60"],
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        holder.stdout.readline()
        virtual = nvml(environment)
        assert virtual["total"] == 4 * GiB
        assert virtual["used"] == 1 * GiB + 512 * MiB
        real = nvml(limited_env(preload=False))
        assert real["total"] == 80 * GiB
        processes = real["processes"]
        assert isinstance(processes, dict)
        assert processes == {str(holder.pid): 1 * GiB + 512 * MiB} or processes == {
            holder.pid: 1 * GiB + 512 * MiB
        }
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("TENSOR_FUSION_CUDA_MEM_LIMIT", '{"0": "4XB"}', 'bad size "4XB"'),
        ("TENSOR_FUSION_CUDA_MEM_LIMIT", "not json", "TENSOR_FUSION_CUDA_MEM_LIMIT=not json"),
        ("TENSOR_FUSION_CUDA_MEM_LIMIT", '{"gpu0": "1GiB"}', "gpu0"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "lots", "CUDA_DEVICE_MEMORY_LIMIT=lots"),
        ("TF_CUDA_CONTEXT_OVERHEAD", "big", "TF_CUDA_CONTEXT_OVERHEAD=big"),
    ],
)
def test_bad_configuration_fails_cuda_initialization_with_one_line(
    limited_env: LimitedEnv, variable: str, value: str, message: str
) -> None:
    result = run([WORKLOAD, "--kernels", "1"], limited_env(**{variable: value}))
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"] == "CUDA_ERROR_NOT_INITIALIZED in cuInit"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0] and "error" in lines[0], result.stderr


def test_index_and_uuid_keys_that_disagree_fail_closed(limited_env: LimitedEnv) -> None:
    uuid = "GPU-5157a1e0-0000-4000-8000-000000000001"
    result = run([WORKLOAD, "--kernels", "1"], limited_env(f'{{"0": "2GiB", "{uuid}": "3GiB"}}'))
    assert result.returncode == 1
    assert "cuInit" in json.loads(result.stdout)["error"]
    assert len(result.stderr.splitlines()) == 1


def test_a_program_without_cuda_is_unaffected(limited_env: LimitedEnv) -> None:
    shell = shutil.which("sh") or "/bin/sh"
    environment = limited_env("this is not json")  # never read: nothing calls CUDA
    plain = run([shell, "-c", "env | sort"], environment | {"LD_PRELOAD": ""})
    preloaded = run([shell, "-c", "env | sort"], environment)
    assert preloaded.returncode == plain.returncode == 0
    assert preloaded.stderr == plain.stderr == ""
    strip = [line for line in preloaded.stdout.splitlines() if not line.startswith("LD_PRELOAD=")]
    assert strip == [
        line for line in plain.stdout.splitlines() if not line.startswith("LD_PRELOAD=")
    ]


def test_the_limiter_is_a_plain_guest_library() -> None:
    from tests.support import elf

    library = library_path()  # the built library itself, also where tests use another build
    assert {n for n in elf.undefined_symbols(library) if n.startswith(("Py", "_Py"))} == set()
    assert set(elf.dynamic_entries(library, "NEEDED")) <= {
        "libc.so.6",
        "libdl.so.2",
        "libpthread.so.0",
    }
    assert elf.dynamic_entries(library, "RPATH") == elf.dynamic_entries(library, "RUNPATH") == []
    assert elf.newest_glibc_version(library) <= (2, 17)
    result = subprocess.run(
        ["sh", "-c", "echo loaded"],
        env={"LD_PRELOAD": str(library), "LD_BIND_NOW": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stdout == "loaded\n" and result.stderr == ""


def test_arrays_of_every_format_are_charged(tmp_path: Path) -> None:
    """Block-compressed, normalized and video formats by their layout (the simulated driver takes
    only the classic ones), and a format not known never as nothing (tests/c/array_sizes_test.c)."""
    csrc = Path(__file__).parents[2] / "packages/limiter/csrc"
    program = build_unit_test(
        "array_sizes_test",
        [csrc / "common/vgpu_cuda_sizes.c"],
        [csrc / "common", csrc / "include", Path(__file__).parents[1] / "c"],
        tmp_path,
    )
    result = subprocess.run([program], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith(" passed, 0 failed\n")
