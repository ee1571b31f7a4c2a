"""Cost of the tf-hypervisor daemon on a busy simulated node.

8 simulated GPUs, 32 pods (4 per GPU, memory and compute limits), 64 workers (2 per pod, each
holding memory and running paced kernels under the limiter). At the default settings (NVML
sampled every second, pod passes every second, influx metrics file on) it measures:
  - the daemon's CPU time over an idle window, as a share of one core;
  - API latency at a fixed request rate from a local client (status, GPUs, pods, one pod,
    workers, /metrics in turn), and the daemon's CPU during that load.
Prints one JSON line per measurement.
Usage: python benchmarks/hypervisor_cost.py [--gpus 8] [--pods 32] [--workers 64]
       [--idle-seconds 30] [--rate 200] [--load-seconds 20] [--daemon-flag=FLAG ...]
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from vgpu_limiter import library_path, sim


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def _start_workers(
    root: Path, environment: dict[str, str], gpus: int, pods: int, count: int
) -> list[subprocess.Popen[bytes]]:
    workers: list[subprocess.Popen[bytes]] = []
    base = {k: v for k, v in environment.items() if k != "VGPU_SIM_DEVICES"}
    worker_env = base | sim.environment(state=root / "node.state", base=base)
    worker_env |= {
        "LD_PRELOAD": str(library_path()),
        "SHM_BASE_PATH": str(root / "shm"),
        "VGPU_SIM_DEVICES": str(gpus),
    }
    for number in range(count):
        pod = number % pods
        env = worker_env | {
            "POD_NAME": f"pod-{pod}",
            "POD_NAMESPACE": f"team-{pod % 4}",
            "CUDA_VISIBLE_DEVICES": str(pod % gpus),
        }
        command = [str(sim.workload_path()), "--alloc", "256MiB"]
        command += ["--kernels", "1000000", "--kernel-us", "2000"]
        workers.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL))
    return workers


def _measure_load(http: httpx.Client, process: psutil.Process, rate: float, seconds: float) -> None:
    paths = [
        "/api/v1/status",
        "/api/v1/gpus",
        "/api/v1/pods",
        "/api/v1/pods/team-1/pod-1",
        "/api/v1/workers",
        "/metrics",
    ]
    latencies: dict[str, list[float]] = {path: [] for path in paths}
    period = 1 / rate
    count = int(rate * seconds)
    started, cpu = time.monotonic(), _cpu(process)
    late = 0
    for number in range(count):
        due = started + number * period
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        elif now - due > period:
            late += 1
        path = paths[number % len(paths)]
        sent = time.perf_counter()
        http.get(path).raise_for_status()
        latencies[path].append(time.perf_counter() - sent)
    elapsed = time.monotonic() - started
    share = (_cpu(process) - cpu) / elapsed
    every = sorted(value for values in latencies.values() for value in values)

    def quantile(values: list[float], q: float) -> float:
        return round(1000 * values[min(len(values) - 1, int(q * len(values)))], 3)

    _emit(
        measure="api_latency",
        rate_per_s=round(count / elapsed, 1),
        requests=count,
        late_sends=late,
        p50_ms=quantile(every, 0.50),
        p99_ms=quantile(every, 0.99),
        max_ms=round(1000 * every[-1], 3),
        p99_ms_by_path={path: quantile(sorted(v), 0.99) for path, v in latencies.items()},
        mean_ms=round(1000 * statistics.fmean(every), 3),
        daemon_cpu_share_of_one_core=round(share, 4),
    )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=32)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--idle-seconds", type=float, default=30)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--load-seconds", type=float, default=20)
    parser.add_argument(
        "--port", type=int, default=0, help="the daemon's API port (default: a free one)"
    )
    parser.add_argument(
        "--daemon-flag",
        action="append",
        default=[],
        help="one more daemon flag (repeatable), e.g. --daemon-flag=--no-boost-correction",
    )
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    root = Path(tempfile.mkdtemp(prefix="vgpu-daemon-cost-"))
    port = args.port or _free_port()
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("VGPU_SIM_", "TF_", "SHM_"))
    } | {"VGPU_SIM_DEVICES": str(args.gpus)}
    flags = ["--listen", f"127.0.0.1:{port}", "--token-file", str(root / "token")]
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vgpu_hypervisor",
            "daemon",
            "--simulate",
            "--config",
            "",
            "--sim-state",
            str(root / "node.state"),
            "--shm-base-path",
            str(root / "shm"),
            "--metrics-file",
            str(root / "metrics.influx"),
            "--log-path",
            str(root / "daemon.log"),
            *flags,
            *args.daemon_flag,
        ],
        env=environment,
    )
    workers: list[subprocess.Popen[bytes]] = []
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if http.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("the daemon did not start")
            time.sleep(0.1)
        token = (root / "token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        http.headers.update(auth)  # reads need the token too
        for number in range(args.pods):
            body = {
                "name": f"pod-{number}",
                "namespace": f"team-{number % 4}",
                "gpus": {str(number % args.gpus): {"memory": "4GiB", "compute": 10}},
            }
            http.post("/api/v1/pods", json=body, headers=auth).raise_for_status()

        workers.extend(_start_workers(root, environment, args.gpus, args.pods, args.workers))
        deadline = time.monotonic() + 60
        while len(http.get("/api/v1/workers").json()) < args.workers:
            if time.monotonic() > deadline:
                raise SystemExit("not every worker showed up")
            time.sleep(0.2)
        time.sleep(2)

        process = psutil.Process(daemon.pid)
        started, cpu = time.monotonic(), _cpu(process)
        time.sleep(args.idle_seconds)
        share = (_cpu(process) - cpu) / (time.monotonic() - started)
        _emit(
            measure="daemon_cpu_idle",
            gpus=args.gpus,
            pods=args.pods,
            workers=args.workers,
            seconds=args.idle_seconds,
            cpu_share_of_one_core=round(share, 4),
        )

        _measure_load(http, process, args.rate, args.load_seconds)
    finally:
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.wait()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        http.close()


if __name__ == "__main__":
    main()
