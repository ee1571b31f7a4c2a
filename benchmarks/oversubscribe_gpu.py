"""Memory oversubscription on a real GPU, each measure printed as one JSON line.

Needs a CUDA GPU, nvidia-smi, the built libcuda_limiter.so and vgpu_limiter (to write the pod
regions, as the daemon does); PyTorch and CuPy where present. Each workload's working set is
1.5x the pod's 4 GiB limit; each runs in a fresh process, in a pod with oversubscription on
(it must complete) and in one without (it must fail with out-of-memory), while a sampler reads
what nvidia-smi (without the limiter) shows the process holding on the device:
  torch   a training loop (MLP, Adam): step time against the same loop without the limiter
  cupy    elementwise passes over arrays
  driver  the plain driver API through ctypes: cuMemAlloc_v2, cuMemsetD8 from the GPU, a read
          back to the host, cuMemFree_v2
Usage: python benchmarks/oversubscribe_gpu.py --library path/to/libcuda_limiter.so
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

GiB = 1 << 30
MiB = 1 << 20
LIMIT = 4 * GiB

TORCH = textwrap.dedent(
    """
    import json, sys, time, torch
    steps = int(sys.argv[1])
    # 6 layers of 8192x8192 fp32: 1.5 GiB of weights, as much again of gradients and twice
    # that of Adam's moments: about 6 GiB, 1.5x the limit.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192, bias=False) for _ in range(6)])
    model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = torch.randn(512, 8192, device="cuda")
    times = []
    try:
        for step in range(steps + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            loss = model(batch).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            torch.cuda.synchronize()
            if step > 0:  # the first step allocates the gradients and moments
                times.append(time.perf_counter() - start)
    except torch.OutOfMemoryError as error:
        print(json.dumps({"oom": str(error).splitlines()[0][:160]}), flush=True)
        sys.exit(0)
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({"completed": True, "step_s": sorted(times)[len(times) // 2],
                      "loss": float(loss), "total_mib": total >> 20,
                      "reserved_mib": torch.cuda.memory_reserved() >> 20}), flush=True)
    """
)

CUPY = textwrap.dedent(
    """
    import json, sys, time, cupy
    passes = int(sys.argv[1])
    arrays = []
    try:
        for _ in range(24):  # 24 x 256 MiB = 6 GiB
            arrays.append(cupy.full(64 << 20, 1.0, dtype=cupy.float32))
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(passes):
            for array in arrays:
                array *= 1.0001
        cupy.cuda.Device().synchronize()
        elapsed = time.perf_counter() - start
    except cupy.cuda.memory.OutOfMemoryError as error:
        print(json.dumps({"oom": str(error)[:160], "arrays": len(arrays)}), flush=True)
        sys.exit(0)
    checksum = float(sum(float(array[-1]) for array in arrays))
    print(json.dumps({"completed": True, "pass_s": elapsed / passes, "checksum": checksum}),
          flush=True)
    """
)

DRIVER = textwrap.dedent(
    """
    import ctypes, json
    cu = ctypes.CDLL("libcuda.so.1")
    u64, size = ctypes.c_uint64, ctypes.c_size_t
    assert cu.cuInit(0) == 0
    device, context = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuDeviceGet(ctypes.byref(device), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
    assert cu.cuCtxSetCurrent(context) == 0
    chunk, pointers, code = 256 << 20, [], 0
    while len(pointers) < 24:  # 6 GiB
        pointer = u64()
        code = cu.cuMemAlloc_v2(ctypes.byref(pointer), size(chunk))
        if code != 0:
            break
        pointers.append(pointer.value)
    if code != 0:
        print(json.dumps({"oom": f"cuMemAlloc_v2 returned {code}",
                          "chunks": len(pointers)}), flush=True)
        raise SystemExit(0)
    byte = ctypes.c_ubyte()
    for index, pointer in enumerate(pointers):  # written by the GPU, read back by the host
        assert cu.cuMemsetD8_v2(u64(pointer), ctypes.c_ubyte(index + 1), size(chunk)) == 0
    assert cu.cuCtxSynchronize() == 0
    right = 0
    for index, pointer in enumerate(pointers):
        assert cu.cuMemcpyDtoH_v2(ctypes.byref(byte), u64(pointer + chunk - 1), size(1)) == 0
        right += byte.value == index + 1
    free, total = size(), size()
    assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    for pointer in pointers:
        assert cu.cuMemFree_v2(u64(pointer)) == 0
    print(json.dumps({"completed": right == len(pointers), "chunks": len(pointers),
                      "right": right, "total_mib": total.value >> 20,
                      "free_mib": free.value >> 20}), flush=True)
    """
)


def emit(record: dict[str, object]) -> None:
    print(json.dumps(record), flush=True)


def gpu_uuid() -> str:
    output = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return output.strip()


def make_pod(folder: Path, uuid: str, oversubscribe: bool) -> None:
    from vgpu_limiter import region as regions

    flags = regions.DEVICE_OVERSUBSCRIBE if oversubscribe else 0
    spec = regions.DeviceLimits(LIMIT, 0, 0, flags)
    folder.mkdir(parents=True)
    regions.create_region(folder / "shm", "bench", folder.name, {uuid: spec}).close()


def host_backed(folder: Path) -> tuple[int, int]:
    """(device-resident, host-backed) bytes the pod's region says it holds."""
    from vgpu_limiter import region as regions

    with regions.open_region(folder / "shm", writable=False) as pod:
        device = pod.devices[0]
        return device.memory_used, device.host_memory_used


class Sampler:
    """What nvidia-smi (run without the limiter) shows a process holding, sampled until
    stopped: the largest value and how many samples were taken."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_mib = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        while not self._stop.is_set():
            output = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-compute-apps=pid,used_memory",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                check=False,
                env=env,
            ).stdout
            for line in output.splitlines():
                parts = [part.strip() for part in line.split(",")]
                if len(parts) == 2 and parts[0] == str(self.pid) and parts[1].isdigit():
                    self.peak_mib = max(self.peak_mib, int(parts[1]))
                    self.samples += 1
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_workload(
    name: str,
    source: str,
    argument: str,
    env: dict[str, str],
    pod: Path | None,
    *,
    timeout_s: float,
) -> dict[str, object]:
    process = subprocess.Popen(
        [sys.executable, "-c", source, argument],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    sampler = Sampler(process.pid)
    pod_bytes: tuple[int, int] | None = None
    # The pod's usage while the workload runs, read from its region like the daemon does.
    deadline = time.monotonic() + timeout_s
    while pod is not None and process.poll() is None and time.monotonic() < deadline:
        now = host_backed(pod)
        pod_bytes = max(pod_bytes or now, now, key=lambda pair: (pair[1], pair[0]))
        time.sleep(0.2)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        stderr += f"\ntimed out after {timeout_s} s"
    sampler.stop()
    lines = stdout.strip().splitlines()
    record: dict[str, object] = json.loads(lines[-1]) if lines else {}
    if process.returncode != 0 or not lines:
        record["error"] = (stderr.strip().splitlines() or ["no output"])[-1][:300]
    record |= {"workload": name, "smi_peak_mib": sampler.peak_mib, "smi_samples": sampler.samples}
    if pod_bytes is not None:
        record |= {"pod_device_mib": pod_bytes[0] >> 20, "pod_host_mib": pod_bytes[1] >> 20}
    return record


def limited(library: str, pod: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TENSOR_FUSION_", "SHM_"))}
    return base | {"LD_PRELOAD": library, "SHM_PATH": str(pod)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True, help="libcuda_limiter.so")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps")
    parser.add_argument("--workloads", default="torch,cupy,driver")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    args = parser.parse_args()
    library = str(Path(args.library).resolve())
    uuid = gpu_uuid()
    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    sources = {"torch": (TORCH, str(args.steps)), "cupy": (CUPY, "10"), "driver": (DRIVER, "")}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.workloads.split(","):
            source, argument = sources[name]
            unlimited = run_workload(name, source, argument, plain, None, timeout_s=args.timeout)
            emit(unlimited | {"pod": "none"})
            for oversubscribe in (True, False):
                pod = Path(scratch) / f"{name}-{'over' if oversubscribe else 'plain'}"
                make_pod(pod, uuid, oversubscribe)
                record = run_workload(
                    name, source, argument, limited(library, pod), pod, timeout_s=args.timeout
                )
                record |= {
                    "pod": "oversubscribe" if oversubscribe else "limit only",
                    "limit_mib": LIMIT >> 20,
                }
                for key in ("step_s", "pass_s"):
                    if isinstance(record.get(key), float) and unlimited.get(key):
                        record[f"{key}_vs_unlimited"] = round(
                            record[key] / unlimited[key],
                            2,  # type: ignore[operator]
                        )
                emit(record)


if __name__ == "__main__":
    main()
