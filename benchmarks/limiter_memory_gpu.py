"""The memory limiter on a real GPU, each measure printed as one JSON line.

Needs a CUDA GPU, PyTorch and nvidia-smi. Runs, each in fresh processes:
  view       PyTorch under a 4 GiB limit: total memory it sees, through CUDA and NVML
  oom        allocate 256 MiB tensors until torch.OutOfMemoryError, then free and go on;
             what nvidia-smi (without the limiter) shows the process holding meanwhile
  expandable the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (VMM path)
  two        two processes of one pod allocating at once share the 4 GiB
  smi        nvidia-smi under the limiter shows the pod's limit
  launch     a loop of tiny kernels with and without the library (no compute limit),
             alternating runs, as a ratio
Usage: python benchmarks/limiter_memory_gpu.py --library path/to/libcuda_limiter.so
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

MiB = 1 << 20
LIMIT = "4GiB"

HOLDER = textwrap.dedent(
    """
    import json, sys, torch
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    report = {"pid": __import__("os").getpid(), "total_mib": total >> 20,
              "device_total_mib": torch.cuda.get_device_properties(0).total_memory >> 20}
    print(json.dumps(dict(report, stage="context")), flush=True)
    sys.stdin.readline()
    tensors = []
    try:
        while True:
            tensors.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as error:
        report["oom"] = type(error).__name__
    report["allocated_mib"] = 256 * len(tensors)
    free, total = torch.cuda.mem_get_info()
    report["free_mib_at_oom"] = free >> 20
    # The program goes on: free one tensor and allocate again.
    tensors.pop()
    torch.cuda.empty_cache()
    tensors.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    report["continued"] = True
    print(json.dumps(dict(report, stage="holding")), flush=True)
    sys.stdin.readline()
    """
)

LAUNCHES = textwrap.dedent(
    """
    import json, time, torch
    x = torch.zeros(1, device="cuda")
    for _ in range(2000):
        x.add_(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(%d):
        x.add_(1)
    torch.cuda.synchronize()
    print(json.dumps({"us_per_launch": (time.perf_counter() - start) / %d * 1e6}))
    """
)


def emit(record: dict[str, object]) -> None:
    print(json.dumps(record), flush=True)


def environment(library: str, pod: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TENSOR_FUSION_", "SHM_"))}
    return (
        base
        | {
            "LD_PRELOAD": library,
            "SHM_PATH": str(pod),
            "TENSOR_FUSION_CUDA_MEM_LIMIT": json.dumps({"0": LIMIT}),
        }
        | extra
    )


def smi_processes() -> dict[int, int]:
    """pid → MiB on the GPU, from nvidia-smi without the limiter."""
    output = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
    ).stdout
    processes = {}
    for line in output.splitlines():
        if line.strip():
            pid, used = (part.strip() for part in line.split(","))
            processes[int(pid)] = int(used)
    return processes


def start_holder(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def read(holder: subprocess.Popen[str]) -> dict[str, object]:
    assert holder.stdout is not None
    line = holder.stdout.readline()
    if not line:
        raise RuntimeError(f"holder died: {holder.stderr.read() if holder.stderr else ''}")
    record: dict[str, object] = json.loads(line)
    return record


def go(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.write("\n")
    holder.stdin.flush()


def finish(holder: subprocess.Popen[str]) -> str:
    go(holder)
    _, errors = holder.communicate(timeout=60)
    return errors


def allocate_until_oom(name: str, env: dict[str, str]) -> None:
    holder = start_holder(env)
    context = read(holder)
    context_mib = smi_processes().get(int(context["pid"]), -1)
    go(holder)
    holding = read(holder)
    smi = smi_processes()
    errors = finish(holder)
    emit(
        {
            "measure": name,
            "limit": LIMIT,
            **{k: v for k, v in holding.items() if k != "stage"},
            "context_mib_by_nvidia_smi": context_mib,
            "process_mib_by_nvidia_smi": smi.get(int(holding["pid"]), -1),
            "limiter_stderr": errors.strip()[-500:],
        }
    )


def two_processes(env: dict[str, str]) -> None:
    holders = [start_holder(env) for _ in range(2)]
    contexts = [read(holder) for holder in holders]
    for holder in holders:
        go(holder)
    holding = [read(holder) for holder in holders]
    smi = smi_processes()
    for holder in holders:
        finish(holder)
    emit(
        {
            "measure": "two_processes_one_pod",
            "limit": LIMIT,
            "allocated_mib": [h["allocated_mib"] for h in holding],
            "process_mib_by_nvidia_smi": [smi.get(int(c["pid"]), -1) for c in contexts],
            "pod_mib_by_nvidia_smi": sum(smi.get(int(c["pid"]), 0) for c in contexts),
        }
    )


def smi_under_limiter(env: dict[str, str]) -> None:
    holder = start_holder(env)
    context = read(holder)
    output = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    plain = subprocess.run(["nvidia-smi"], capture_output=True, text=True, env=env, check=False)
    finish(holder)
    go_line = [line for line in plain.stdout.splitlines() if "MiB /" in line]
    emit(
        {
            "measure": "nvidia_smi_under_limiter",
            "query": output.stdout.strip(),
            "table_memory_line": go_line[0].strip() if go_line else plain.stderr.strip()[-300:],
            "holder_total_mib": context["total_mib"],
        }
    )


def launch_overhead(library: str, pod: Path, rounds: int, launches: int) -> None:
    program = LAUNCHES % (launches, launches)
    samples: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(rounds):
        for name in ("without", "with"):  # alternating, so drift hits both alike
            env = (
                environment(library, pod)
                if name == "with"
                else {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            )
            if name == "with":
                env.pop("TENSOR_FUSION_CUDA_MEM_LIMIT")
            result = subprocess.run(
                [sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True
            )
            samples[name].append(json.loads(result.stdout)["us_per_launch"])
    without = statistics.median(samples["without"])
    with_library = statistics.median(samples["with"])
    emit(
        {
            "measure": "tiny_launch_loop",
            "rounds": rounds,
            "launches": launches,
            "us_per_launch_without": round(without, 3),
            "us_per_launch_with": round(with_library, 3),
            "ratio": round(with_library / without, 4),
            "samples": {k: [round(v, 3) for v in vs] for k, vs in samples.items()},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True, help="libcuda_limiter.so")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--launches", type=int, default=20000)
    parser.add_argument("--only", nargs="*", default=["oom", "expandable", "two", "smi", "launch"])
    args = parser.parse_args()
    library = str(Path(args.library).resolve())
    work = Path(tempfile.mkdtemp(prefix="vgpu-gpu-"))
    started = time.monotonic()
    if "oom" in args.only:
        allocate_until_oom("oom", environment(library, work / "pod-oom"))
    if "expandable" in args.only:
        allocate_until_oom(
            "expandable_segments",
            environment(
                library, work / "pod-vmm", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"
            ),
        )
    if "two" in args.only:
        two_processes(environment(library, work / "pod-two"))
    if "smi" in args.only:
        smi_under_limiter(environment(library, work / "pod-smi"))
    if "launch" in args.only:
        launch_overhead(library, work / "pod-launch", args.rounds, args.launches)
    emit({"measure": "done", "seconds": round(time.monotonic() - started, 1)})


if __name__ == "__main__":
    main()
