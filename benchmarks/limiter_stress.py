"""Stress of the memory limiter: racing allocations, SIGKILLs and restarts against one pod.

N worker processes of M threads each (benchmarks/limiter_stress.c, built here with cc) allocate
and free through every allocation API the limiter charges (cuMemAlloc_v2, cuMemAllocPitch_v2,
cuMemAllocManaged, cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemCreate with mappings, arrays,
mipmapped arrays, contexts), each process by one of the three call paths (linked, dlsym,
cuGetProcAddress), under libcuda_limiter.so on the simulated GPU, all in one pod with a memory
limit. Random workers are SIGKILLed and replaced at the kill rate; at the end the rest get
SIGTERM and free what they hold. A monitor process samples the device (simulated NVML, which
like the real driver drops a dead process's memory) and the pod region all along.

Then, with every worker gone: the device's and the region's usage, after one fresh process of
the pod has allocated the whole limit and exited (a process of the pod reclaims what dead ones
were charged when it needs the room) - both must be 0.

Prints JSON lines: one per allocation API (calls tried, refused, failed otherwise), then the
summary (most bytes over the limit the monitor saw on the device and in the region, bytes
leaked, processes started and killed, duration and parameters).
Usage: python benchmarks/limiter_stress.py [--processes 16] [--threads 4] [--seconds 60]
       [--kill-rate 10] [--limit 4GiB] [--max-alloc 512MiB] [--context 64MiB] [--seed 1]
       [--preload LIBS] [--without-limiter]   (the control: the same race unchecked)
"""

import argparse
import ctypes
import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path

from vgpu_limiter import library_path, sim
from vgpu_limiter.region import RegionError, open_region

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parent / "packages" / "limiter" / "csrc" / "include"
PATHS = ("linked", "dlopen", "procaddress")
COUNTERS = ("tried", "refused", "failed")
GRACE_S = 30  # for workers to free what they hold after SIGTERM
WORKER_NICENESS = 10
_UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _size(text: str) -> int:
    match = re.fullmatch(r"(\d+)(KiB|MiB|GiB)?", text.strip())
    if match is None or int(match[1]) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 4GiB or 1048576")
    return int(match[1]) * _UNITS[match[2] or ""]


def _build(work: Path) -> Path:
    program = work / "limiter_stress"
    subprocess.run(
        [
            *("cc", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}"),
            str(HERE / "limiter_stress.c"),
            *("-o", str(program), f"-L{sim.library_dir()}", "-l:libcuda.so.1"),
            *("-ldl", "-lpthread"),
        ],
        check=True,
    )
    return program


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


def _device_reader(environment: dict[str, str]) -> Callable[[], int]:
    """Bytes used on device 0 as simulated NVML reports them (without the limiter)."""
    os.environ.update(environment)
    nvml = ctypes.CDLL(str(sim.library_dir() / "libnvidia-ml.so.1"))
    handle = ctypes.c_void_p()
    if nvml.nvmlInit_v2() != 0 or nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)):
        raise RuntimeError("simulated NVML: cannot open device 0")

    def used() -> int:
        memory = _Memory()
        if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
            raise RuntimeError("simulated NVML: nvmlDeviceGetMemoryInfo failed")
        return int(memory.used)

    return used


def _monitor(
    environment: dict[str, str], region_path: Path, limit: int, stop: Event, out: Connection
) -> None:
    """Sample the device and the region until ``stop``; send the extremes back."""
    device_used = _device_reader(environment)
    region = None
    found = {"samples": 0, "region_samples": 0, "max_device": 0, "max_region": 0}
    found |= {"device_samples_over": 0, "region_samples_over": 0}
    parent = os.getppid()
    while not stop.is_set() and os.getppid() == parent:  # nor outlive the benchmark
        device = device_used()
        found["samples"] += 1
        found["max_device"] = max(found["max_device"], device)
        found["device_samples_over"] += device > limit
        if region is None and region_path.exists():
            region = open_region(region_path, writable=False)
        if region is not None:
            # The pod has one device; its entry appears when the first process charges it.
            held = sum(entry.memory_used for entry in region.devices)
            found["region_samples"] += 1
            found["max_region"] = max(found["max_region"], held)
            found["region_samples_over"] += held > limit
        time.sleep(0.0005)
    out.send(found)


@dataclass
class _Workers:
    program: Path
    environment: dict[str, str]
    stats: Path
    threads: int
    max_alloc: int
    rng: random.Random
    rows: int  # of counters in a worker's stats file
    running: list[subprocess.Popen[bytes]] = field(default_factory=list)
    started: int = 0
    killed: int = 0
    exits: dict[int, int] = field(default_factory=dict)  # exit status: processes

    def start(self) -> None:
        number = self.started
        self.started += 1
        stats = self.stats / f"{number}.bin"
        stats.write_bytes(bytes(8 * len(COUNTERS) * self.rows))
        # Niced (nice execs the program, so its pid is the worker's), so that the monitor and
        # the killer keep their pace on a busy machine.
        command = ["nice", "-n", str(WORKER_NICENESS), str(self.program)]
        command += [PATHS[number % len(PATHS)], str(self.threads)]
        command += [str(self.rng.getrandbits(63)), str(self.max_alloc), str(stats)]
        # Started with SIGTERM blocked (the mask survives exec): the worker unblocks it once it
        # can stop cleanly, so a worker started just before the end is not cut short by it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            self.running.append(subprocess.Popen(command, env=self.environment))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def kill_one(self) -> None:
        victim = self.running.pop(self.rng.randrange(len(self.running)))
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.killed += 1
        self.start()

    def replace_exited(self) -> None:
        for worker in [w for w in self.running if w.poll() is not None]:
            self.running.remove(worker)
            self.exits[worker.returncode] = self.exits.get(worker.returncode, 0) + 1
            self.start()

    def stop_all(self) -> None:
        for worker in self.running:
            worker.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for worker in self.running:
            try:
                code = worker.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()
                code = worker.wait()
            self.exits[code] = self.exits.get(code, 0) + 1
        self.running.clear()


def _totals(stats: Path, rows: list[str]) -> dict[str, list[int]]:
    """Counters of every worker by row: the allocation APIs, then the clean-up calls."""
    totals = {name: [0] * len(COUNTERS) for name in rows}
    for file in stats.iterdir():
        data = file.read_bytes()
        for row, name in enumerate(totals):
            for column in range(len(COUNTERS)):
                offset = 8 * (row * len(COUNTERS) + column)
                totals[name][column] += int.from_bytes(data[offset : offset + 8], "little")
    return totals


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=16, help="workers at any time")
    parser.add_argument("--threads", type=int, default=4, help="allocating threads per worker")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--kill-rate", type=float, default=10.0, help="SIGKILLs per second")
    parser.add_argument("--limit", type=_size, default=_size("4GiB"), help="pod memory limit")
    parser.add_argument("--max-alloc", type=_size, default=_size("512MiB"))
    parser.add_argument("--context", type=_size, default=_size("64MiB"), help="per context")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--preload",
        default=str(library_path()),
        help="LD_PRELOAD of the workers (default: libcuda_limiter.so), e.g. a sanitizer build",
    )
    parser.add_argument(
        "--without-limiter",
        action="store_true",
        help="the same race without libcuda_limiter.so: shows what the monitor sees unchecked",
    )
    args = parser.parse_args()
    if not 1 <= args.processes <= 200 or not 1 <= args.threads <= 64:
        parser.error("--processes must be 1 to 200 and --threads 1 to 64")
    if args.seconds <= 0 or args.kill_rate < 0 or args.limit <= args.context:
        parser.error("--seconds must be > 0, --kill-rate >= 0 and --limit > --context")
    return args


def _race(args: argparse.Namespace, workers: _Workers) -> float:
    """Keep args.processes workers running for args.seconds, killing and replacing them at
    args.kill_rate, then stop the rest; the seconds it took."""
    rng = workers.rng
    started = time.monotonic()
    for _ in range(args.processes):
        workers.start()
    end = started + args.seconds
    next_kill = started + (rng.expovariate(args.kill_rate) if args.kill_rate else args.seconds)
    while (now := time.monotonic()) < end:
        if now >= next_kill:
            workers.kill_one()
            next_kill += rng.expovariate(args.kill_rate)
        workers.replace_exited()
        time.sleep(max(0.0, min(0.01, next_kill - now, end - now)))
    workers.stop_all()
    return time.monotonic() - started


def _leaks(
    args: argparse.Namespace, node: dict[str, str], limited: dict[str, str], region: Path
) -> dict[str, object]:
    """With every worker gone: what the device still holds, whether one fresh process of the
    pod gets the whole limit (reclaiming what killed ones were charged), and what the region
    holds after it."""
    device = _device_reader(node)()
    if args.without_limiter:
        return {"leaked_device_bytes": device}
    probe = subprocess.run(
        [str(sim.workload_path()), "--kernels", "0", "--alloc", str(args.limit - args.context)],
        env=limited,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        with open_region(region, writable=False) as opened:
            held = sum(entry.memory_used for entry in opened.devices)
    except RegionError as error:
        raise SystemExit(f"limiter_stress: {error}") from None
    return {
        "leaked_device_bytes": device,
        "leaked_region_bytes": held,
        "whole_limit_allocatable_after": probe.returncode == 0,
    }


def _run(args: argparse.Namespace, work: Path) -> None:
    program = _build(work)
    (work / "stats").mkdir()
    region = work / "pod" / "shm"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU_SIM_", "TF_", "POD_"))}
    node = sim.environment(
        devices=f"count=1,overhead={args.context}", state=work / "node.state", base=base
    )
    limited = (
        base
        | node
        | {
            "LD_PRELOAD": args.preload,
            "SHM_PATH": str(region.parent),
            "TENSOR_FUSION_CUDA_MEM_LIMIT": json.dumps({"0": str(args.limit)}),
            "TF_CUDA_CONTEXT_OVERHEAD": str(args.context),
            "TF_LOG_LEVEL": "error",
        }
    )
    if args.without_limiter:
        del limited["LD_PRELOAD"]
    rows = subprocess.run(
        [str(program), "--rows"], env=base | node, capture_output=True, text=True, check=True
    ).stdout.splitlines()

    context = multiprocessing.get_context("fork")
    stop = context.Event()
    receive, send = context.Pipe(duplex=False)
    monitor = context.Process(
        target=_monitor, args=(node, region, args.limit, stop, send), daemon=True
    )
    monitor.start()
    send.close()  # the monitor's end only: its death is then an EOF here, not a hang
    rng = random.Random(args.seed)
    workers = _Workers(
        program, limited, work / "stats", args.threads, args.max_alloc, rng, len(rows)
    )
    duration = _race(args, workers)
    stop.set()
    try:
        found = receive.recv()
    except EOFError:
        raise SystemExit("limiter_stress: the monitor died (its error is above)") from None
    monitor.join()
    leaks = _leaks(args, node, limited, region)

    totals = _totals(work / "stats", rows)
    for name, (tried, refused, failed) in totals.items():
        print(json.dumps({"api": name, "tried": tried, "refused": refused, "failed": failed}))
    allocations = list(totals.values())[:-1]
    summary = {
        "benchmark": "limiter_stress",
        "device": "simulated",
        "max_over_limit_device_bytes": max(0, found["max_device"] - args.limit),
        "max_over_limit_region_bytes": max(0, found["max_region"] - args.limit),
        "samples_over_limit": found["device_samples_over"] + found["region_samples_over"],
        "max_device_used_bytes": found["max_device"],
        "max_region_used_bytes": found["max_region"],
        **leaks,
        "processes_started": workers.started,
        "processes_killed": workers.killed,
        "exit_statuses": {str(k): v for k, v in sorted(workers.exits.items())},
        "allocations_tried": sum(counts[0] for counts in allocations),
        "allocations_refused": sum(counts[1] for counts in allocations),
        "calls_failed": sum(counts[2] for counts in totals.values()),
        "monitor_samples": found["samples"],
        "duration_s": round(duration, 2),
        **{name: getattr(args, name) for name in ("processes", "threads", "seconds", "kill_rate")},
        "limit_bytes": args.limit,
        "max_alloc_bytes": args.max_alloc,
        "context_bytes": args.context,
        "seed": args.seed,
        "limiter": not args.without_limiter,
    }
    print(json.dumps(summary), flush=True)


def main() -> None:
    args = _arguments()
    with tempfile.TemporaryDirectory(prefix="vgpu-stress-") as work:
        _run(args, Path(work))


if __name__ == "__main__":
    main()
