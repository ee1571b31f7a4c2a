"""The compute limiter on a real GPU, each result printed as one JSON line.

Workloads (PyTorch): bf16 4096³ matmul loop; medium elementwise kernels (~40 µs); the same as a
CUDA graph replay; long kernels (50 ms spin kernels). Other frameworks' launch paths with the
same elementwise step (--kinds cupy jax triton): CuPy, JAX (XLA), Triton; matmuls in the other
frameworks (--kinds jax_matmul cupy_matmul: a jitted bf16 and a CuPy fp16 4096³); bf16 matmuls of
other sizes and fp32 (matmul_large, matmul_small, matmul_fp32), which draw other power. Each
runs alone unlimited (its throughput is 100 %), then under each limit in a fresh process, then
unlimited again: the mean of the two unlimited runs is the reference.
Throughput is counted per 1-s window from the program's own synchronizations.
  single   every workload at every --limits value: mean, first window, worst window
  pods     two pods at once (30/70 and 30/30), one pod of two processes at 40 %
  cost     limit 100 and no library against no library: tiny launches and matmul
With --daemon the node daemon runs meanwhile, so its boost correction applies (the daemon's
package and its dependencies must be importable).
Usage: python benchmarks/limiter_compute_gpu.py --library path/to/libcuda_limiter.so [--only …]
"""

import argparse
import atexit
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgpu_limiter import library_path

PROGRAM = textwrap.dedent(
    """
    import json, os, sys, time
    kind, seconds = sys.argv[1], float(sys.argv[2])
    duty = float(os.environ.get("VGPU_BENCH_DUTY", "1"))  # <1: sleep after each batch, unlimited
    if kind == "cupy":  # CuPy's own kernels through the driver API
        import cupy
        x = cupy.ones(16 << 20, dtype=cupy.float32)
        step, batch = (lambda: x.__imul__(1.0000001)), 200
        synchronize = cupy.cuda.Device().synchronize
    elif kind == "cupy_matmul":  # cuBLAS through CuPy: fp16 4096³
        import cupy
        a = cupy.random.random((4096, 4096)).astype(cupy.float16)
        b = cupy.random.random((4096, 4096)).astype(cupy.float16)
        step, batch = (lambda: a @ b), 40
        synchronize = cupy.cuda.Device().synchronize
    elif kind in ("jax", "jax_matmul"):  # XLA's executables
        import jax, jax.numpy as jnp
        if kind == "jax":
            scale = jax.jit(lambda v: v * 1.0000001)
            state = {"x": jnp.ones(16 << 20, dtype=jnp.float32)}
            def step():
                state["x"] = scale(state["x"])
            batch = 200
        else:  # a jitted bf16 4096³ matmul
            product = jax.jit(lambda a, b: a @ b)
            keys = jax.random.split(jax.random.PRNGKey(0))
            a, b = (jax.random.normal(k, (4096, 4096), dtype=jnp.bfloat16) for k in keys)
            state = {"x": product(a, b)}
            def step():
                state["x"] = product(a, b)
            batch = 40
        synchronize = lambda: state["x"].block_until_ready()
    else:
        import torch
        synchronize = torch.cuda.synchronize
    if kind == "triton":  # Triton's own launcher (libcuda through dlopen)
        import triton, triton.language as tl
        @triton.jit
        def scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 1.0000001, mask=mask)
        x = torch.ones(16 << 20, device="cuda")
        grid = (triton.cdiv(x.numel(), 1024),)
        step, batch = (lambda: scale_kernel[grid](x, x.numel(), BLOCK=1024)), 200
    elif kind in ("matmul", "bursty"):  # bursty: about 8 ms of matmuls, then 40 ms idle
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        step, batch = (lambda: a @ b), 40
    elif kind in ("matmul_large", "matmul_small", "matmul_fp32"):  # other power draws
        size = {"matmul_large": 8192, "matmul_small": 2048, "matmul_fp32": 4096}[kind]
        dtype = torch.float32 if kind == "matmul_fp32" else torch.bfloat16
        torch.backends.cuda.matmul.allow_tf32 = False
        a = torch.randn(size, size, device="cuda", dtype=dtype)
        b = torch.randn(size, size, device="cuda", dtype=dtype)
        step, batch = (lambda: a @ b), {8192: 5, 2048: 400, 4096: 4}[size]
    elif kind == "elementwise":
        x = torch.randn(16 << 20, device="cuda")
        step, batch = (lambda: x.mul_(1.0000001)), 200
    elif kind == "graph":
        x = torch.randn(16 << 20, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                x.mul_(1.0000001)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                x.mul_(1.0000001)
        step, batch = graph.replay, 10
    elif kind == "long":
        step, batch = (lambda: torch.cuda._sleep(100_000_000)), 1
    elif kind == "tiny":
        x = torch.zeros(1, device="cuda")
        step, batch = (lambda: x.add_(1)), 2000
    for _ in range(3):
        step()
    synchronize()
    marks, done, start, started = [], 0, time.perf_counter(), time.time()
    rounds = []  # each round's time from its first launch to its end, in ms
    while time.perf_counter() - start < seconds:
        began = time.perf_counter()
        for _ in range(batch):
            step()
        synchronize()
        rounds.append(1000 * (time.perf_counter() - began))
        done += batch
        marks.append((time.perf_counter() - start, done))
        if kind == "bursty":
            time.sleep(0.04)
        elif duty < 1:
            time.sleep((time.perf_counter() - began) * (1 / duty - 1))
    print(json.dumps({"kind": kind, "marks": marks, "started": started, "round_ms": rounds,
                      "monotonic_start": start}))
    """
)


def command(kind: str, seconds: int) -> list[str]:
    """The workload program run as a file (Triton reads its kernels' source from one)."""
    program = Path(tempfile.gettempdir()) / "vgpu_compute_workload.py"
    if not program.exists() or program.read_text() != PROGRAM:
        program.write_text(PROGRAM)
    return [sys.executable, str(program), kind, str(seconds)]


def done_at(marks: list[list[float]], t: float) -> float:
    """Work done by `t` seconds after the start, interpolated between the program's marks."""
    previous = (0.0, 0.0)
    for time_, count in marks:
        if time_ >= t:
            span = time_ - previous[0]
            return previous[1] + (count - previous[1]) * ((t - previous[0]) / span if span else 1)
        previous = (time_, count)
    return previous[1]


def windows(marks: list[list[float]], seconds: int) -> list[float]:
    """Work done in each whole second."""
    return [done_at(marks, k + 1) - done_at(marks, k) for k in range(seconds)]


def run(kind: str, seconds: int, env: dict[str, str]) -> list[float]:
    result = subprocess.run(
        command(kind, seconds),
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=seconds + 60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{kind}: {result.stderr[-800:]}")
    return windows(json.loads(result.stdout)["marks"], seconds)


def start(kind: str, seconds: int, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command(kind, seconds),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def collect(process: subprocess.Popen[str], seconds: int) -> dict[str, Any]:
    """The program's report: its marks and when (wall clock) it started counting."""
    out, err = process.communicate(timeout=seconds + 60)
    if process.returncode != 0:
        raise RuntimeError(err[-800:])
    report: dict[str, Any] = json.loads(out)
    return report


def overlap_rates(reports: list[dict[str, Any]], seconds: int) -> list[float]:
    """Each program's work per second while all of them were counting (programs that start
    together still begin counting up to a second or two apart: their imports and CUDA set-up
    differ)."""
    begin = max(report["started"] for report in reports)
    end = min(report["started"] for report in reports) + seconds
    if end - begin < 1:
        raise RuntimeError("the programs ran at the same time for less than a second")
    return [
        (done_at(r["marks"], end - r["started"]) - done_at(r["marks"], begin - r["started"]))
        / (end - begin)
        for r in reports
    ]


class Daemon:
    """The node daemon (tf-hypervisor) on a base path, for its boost correction, its API on a
    free local port; stopped when the benchmark ends."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, token_file: Path) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}/api/v1"
        self.token_file = token_file

    def post(self, path: str) -> None:
        """A change through the API (e.g. /pods/{namespace}/{name}/freeze)."""
        request = urllib.request.Request(
            self.url + path,
            method="POST",
            headers={"Authorization": f"Bearer {self.token_file.read_text().strip()}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_daemon(work: Path, base: Path, env: dict[str, str], extra: Sequence[str] = ()) -> Daemon:
    """Start the daemon with its log, token and API in `work`, its pods under `base`; `extra`
    flags are added (e.g. --simulate). Returns once its API listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = work / "daemon.log"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "vgpu_hypervisor", "daemon", "--config", ""),
            *("--shm-base-path", str(base)),
            *("--listen", f"127.0.0.1:{port}", "--token-file", str(work / "token")),
            *("--log-path", str(log)),
            *extra,
        ],
        env=env,
    )
    daemon = Daemon(process, port, work / "token")
    atexit.register(daemon.stop)
    for _ in range(300):
        if "API listening" in (log.read_text() if log.exists() else ""):
            return daemon
        if process.poll() is not None:
            break
        time.sleep(0.1)
    daemon.stop()
    raise RuntimeError(f"the daemon did not start: {log.read_text() if log.exists() else ''}")


class Node:
    def __init__(self, library: str) -> None:
        self.library = library
        self.work = Path(tempfile.mkdtemp(prefix="vgpu-compute-"))
        self.pods = 0
        self.plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",)}
        self.daemon: subprocess.Popen[bytes] | None = None

    def start_daemon(self) -> None:
        self.daemon = start_daemon(self.work, self.work / "base", self.plain).process

    def pod_env(self, limit: float | None, pod: str | None = None) -> dict[str, str]:
        self.pods += 1
        env = self.plain | {
            "LD_PRELOAD": self.library,
            "SHM_BASE_PATH": str(self.work / "base"),
            "SHM_PATH": str(self.work / (pod or f"pod{self.pods}")),
        }
        if limit is not None:
            env["TENSOR_FUSION_CUDA_UP_LIMIT"] = json.dumps({"0": limit})
        return env


def pct(rates: list[float], baseline: float) -> list[float]:
    return [round(100 * r / baseline, 1) for r in rates]


def _baseline_line(kind: str, when: str, windows: list[float]) -> float:
    """Print one unlimited run's line; its steady rate per second (the first window left out)."""
    rate = statistics.mean(windows[1:])
    print(
        json.dumps(
            {
                "measure": "baseline",
                "workload": kind,
                "when": when,
                "per_second": round(rate, 1),
                "windows": [round(w, 1) for w in windows],
            }
        ),
        flush=True,
    )
    return rate


def single(node: Node, kinds: list[str], limits: list[float], seconds: int) -> None:
    """Each kind's limited runs between two unlimited ones, the reference being their mean: a
    GPU held at its power limit runs a few percent slower as it warms (a JAX matmul's unlimited
    rate moved 2.5 % between two runs on one H100), which at 50 % is more than a point. Each
    line also gives its mean against either baseline alone (`mean_pct_by_baseline`): the
    measurement's own resolution."""
    for kind in kinds:
        before = _baseline_line(kind, "before", run(kind, seconds, node.plain))
        limited = [(limit, run(kind, seconds, node.pod_env(limit))) for limit in limits]
        after = _baseline_line(kind, "after", run(kind, seconds, node.plain))
        baseline = (before + after) / 2
        for limit, rates in limited:
            got = pct(rates, baseline)
            mean = round(statistics.mean(got), 2)
            print(
                json.dumps(
                    {
                        "measure": "single_pod",
                        "workload": kind,
                        "limit": limit,
                        "mean_pct": mean,
                        "mean_error_pp": round(mean - limit, 2),
                        "first_second_pct": got[0],
                        "worst_window_error_pp": round(max(abs(g - limit) for g in got), 1),
                        "windows_pct": got,
                        "mean_pct_by_baseline": [
                            round(statistics.mean(pct(rates, b)), 2) for b in (before, after)
                        ],
                    }
                ),
                flush=True,
            )


def pods(node: Node, seconds: int, kind: str) -> None:
    baseline = statistics.mean(run(kind, seconds, node.plain)[1:])
    for name, limits, same_pod in (
        ("30/70", (30, 70), False),
        ("30/30", (30, 30), False),
        ("one pod, two processes at 40", (40, 40), True),
    ):
        pod = f"shared{node.pods}" if same_pod else None
        processes = [start(kind, seconds, node.pod_env(limit, pod)) for limit in limits]
        reports = [collect(p, seconds) for p in processes]
        means = pct(overlap_rates(reports, seconds), baseline)
        print(
            json.dumps(
                {
                    "measure": "pods",
                    "case": name,
                    "workload": kind,
                    "limits": limits,
                    "mean_pct": means,  # over the seconds they all ran
                    "total_pct": round(sum(means), 2),
                    "windows_pct": [pct(windows(r["marks"], seconds), baseline) for r in reports],
                }
            ),
            flush=True,
        )


def cost(
    node: Node, seconds: int, rounds: int, kinds: list[str], control: str | None = None
) -> None:
    """Throughput with the library (no limit, and limit 100) against none; with ``control``,
    also against another preloaded library without CUDA hooks, which separates what any
    preload costs from what the hooks cost."""
    for kind in kinds:
        samples: dict[str, list[float]] = {"none": [], "library": [], "limit_100": []}
        if control is not None:
            samples["control"] = []
        for _ in range(rounds):
            for name, values in samples.items():  # alternating: drift hits every case alike
                if name == "none":
                    env = node.plain
                elif name == "control":
                    env = node.plain | {"LD_PRELOAD": str(control)}
                else:
                    env = node.pod_env(100 if name == "limit_100" else None)
                values.append(statistics.mean(run(kind, seconds, env)[1:]))
        medians = {k: statistics.median(v) for k, v in samples.items()}
        extra = {}
        if control is not None:
            extra["ratio_control_preload"] = round(medians["control"] / medians["none"], 4)
        print(
            json.dumps(
                {
                    "measure": "cost",
                    "workload": kind,
                    "rounds": rounds,
                    "ratio_library": round(medians["library"] / medians["none"], 4),
                    "ratio_limit_100": round(medians["limit_100"] / medians["none"], 4),
                    **extra,
                    "per_second": {k: round(v, 1) for k, v in medians.items()},
                }
            ),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--library",
        default=None,
        help="the limiter to preload (default: the installed one, `tf-limiter path`)",
    )
    parser.add_argument("--only", nargs="*", default=["single", "pods", "cost"])
    parser.add_argument("--kinds", nargs="*", default=["matmul", "elementwise", "graph", "long"])
    parser.add_argument("--limits", nargs="*", type=float, default=[10, 25, 50, 75])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cost-kinds", nargs="*", default=["tiny", "matmul"])
    parser.add_argument(
        "--control-preload", help="cost: also preload this library (no CUDA hooks) alone"
    )
    parser.add_argument(
        "--daemon",
        action="store_true",
        help="run the node daemon (tf-hypervisor) meanwhile: its boost correction applies",
    )
    args = parser.parse_args()
    node = Node(str(Path(args.library or library_path()).resolve()))
    if args.daemon:
        node.start_daemon()
    if "single" in args.only:
        single(node, args.kinds, args.limits, args.seconds)
    if "pods" in args.only:
        pods(node, args.seconds, "matmul")
    if "cost" in args.only:
        cost(node, max(3, args.seconds // 2), args.rounds, args.cost_kinds, args.control_preload)


if __name__ == "__main__":
    main()
