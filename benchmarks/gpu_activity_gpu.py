"""Where a loop's GPU time goes, read by the GPU's performance monitor (GPM: Hopper and later),
and how much faster the loop runs when the GPU has power headroom; one JSON line per run.

Each workload (limiter_compute_gpu.py's loops: --kinds matmul jax_matmul cupy_matmul
elementwise …) runs unlimited, then paced by itself to each --duties share of the time (it
sleeps after each batch in proportion to the batch's time; no limiter), then, with --library,
under the compute limiter at each --limits (--daemon: with the node daemon's boost correction),
then unlimited again. Over each run's steady middle, GPM gives the share of time a kernel ran
(`active`), SMs busy (`sm`), tensor cores busy (`tensor`) and DRAM bandwidth used (`dram`), in
percent of the time; NVML the mean SM clock (`sm_mhz`) and power (`watts`, from the energy
counter). Each run's line also has its rate in percent of the unlimited runs' mean (`share`)
and, for self-paced and unlimited runs, the median time of one batch (`batch_ms`: its launches
to its synchronization, on the host's clock).

Per workload a summary line: `gain` at each duty, the unlimited batch time over the paced one
(how much faster a batch runs with headroom: what the boost correction must charge), and
`active_gain`, the same for the time a kernel ran alone (a batch's time times its `active`
share): where the two differ, the loop leaves the GPU idle inside its batches for a time that
does not shrink with the clock (its host's dispatch), and a paced run gains less than its
kernels do.
Usage: python benchmarks/gpu_activity_gpu.py [--kinds …] [--duties 0.25 0.5] [--seconds 6]
       [--library path/to/libcuda_limiter.so --limits 25 50 [--daemon]]
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import limiter_compute_gpu as compute

SETTLE_S = 1.0  # left out at a run's start (its first batches, the clocks settling)
TAIL_S = 0.5  # and at its end
METRICS = {"active": 1, "sm": 2, "tensor": 5, "dram": 10}  # NVML_GPM_METRIC_* ids


class Monitor:
    """GPM samples, the SM clock and the energy counter of GPU 0, read every 0.1 s from a
    thread, with their CLOCK_MONOTONIC times (a program's time.perf_counter())."""

    def __init__(self) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        support = pynvml.nvmlGpmQueryDeviceSupport(self.handle)
        if not support.isSupportedDevice:
            raise SystemExit("this GPU has no performance monitor (GPM): Hopper or later")
        self.samples: list[tuple[float, Any, int, int]] = []  # (time, GPM, SM MHz, energy mJ)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nvml, handle = self.nvml, self.handle
        while not self._stop.wait(0.1):
            sample = nvml.nvmlGpmSampleAlloc()
            nvml.nvmlGpmSampleGet(handle, sample)
            clock = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
            energy = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            self.samples.append((time.perf_counter(), sample, clock, energy))

    def between(self, begin: float, end: float) -> dict[str, float]:
        """The GPU's figures from the first sample at or after `begin` to the last before
        `end`; the older samples are freed."""
        inside = [s for s in list(self.samples) if begin <= s[0] <= end]
        if len(inside) < 2:
            raise RuntimeError("the run was too short to be sampled")
        first, last = inside[0], inside[-1]
        query = self.nvml.c_nvmlGpmMetricsGet_t()
        query.version = self.nvml.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = len(METRICS)
        query.sample1, query.sample2 = first[1], last[1]
        for i, metric in enumerate(METRICS.values()):
            query.metrics[i].metricId = metric
        self.nvml.nvmlGpmMetricsGet(query)
        figures = {name: round(query.metrics[i].value, 2) for i, name in enumerate(METRICS)}
        figures["sm_mhz"] = round(statistics.mean(s[2] for s in inside))
        figures["watts"] = round((last[3] - first[3]) / 1000 / (last[0] - first[0]), 1)
        self._free(lambda s: s[0] <= end)
        return figures

    def _free(self, done: Any) -> None:
        kept = []
        for sample in list(self.samples):
            if done(sample):
                self.nvml.nvmlGpmSampleFree(sample[1])
            else:
                kept.append(sample)
        self.samples[:] = kept

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._free(lambda s: True)


def measure(
    monitor: Monitor, kind: str, seconds: int, env: dict[str, str]
) -> tuple[float, float, dict[str, float]]:
    """One run: its rate over the steady middle, its median batch time (ms) and the GPU's
    figures over the same span."""
    report = compute.collect(compute.start(kind, seconds, env), seconds)
    begin, end = SETTLE_S, seconds - TAIL_S
    done = compute.done_at(report["marks"], end) - compute.done_at(report["marks"], begin)
    rounds = report["round_ms"][len(report["round_ms"]) // 5 :]
    start = report["monotonic_start"]
    figures = monitor.between(start + begin, start + end)
    return done / (end - begin), statistics.median(rounds), figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="*", default=["matmul", "jax_matmul", "cupy_matmul"])
    parser.add_argument("--duties", nargs="*", type=float, default=[0.25, 0.5])
    parser.add_argument("--limits", nargs="*", type=float, default=[])
    parser.add_argument("--library", help="libcuda_limiter.so, for the --limits runs")
    parser.add_argument("--daemon", action="store_true", help="the node daemon runs meanwhile")
    parser.add_argument("--seconds", type=int, default=6)
    args = parser.parse_args()
    if not all(0 < duty < 1 for duty in args.duties):
        parser.error("--duties: shares of the time between 0 and 1")
    if args.limits and args.library is None:
        parser.error("--limits needs --library")
    node = compute.Node(str(Path(args.library).resolve())) if args.library else None
    if args.daemon:
        if node is None:
            parser.error("--daemon needs --library")
        node.start_daemon()
    monitor = Monitor()
    try:
        for kind in args.kinds:
            run_kind(monitor, node, kind, args)
    finally:
        monitor.stop()


def run_kind(
    monitor: Monitor, node: compute.Node | None, kind: str, args: argparse.Namespace
) -> None:
    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    runs: list[tuple[str, float, float, dict[str, float]]] = []
    unlimited = [("unlimited", *measure(monitor, kind, args.seconds, plain))]
    for duty in args.duties:
        env = plain | {"VGPU_BENCH_DUTY": str(duty)}
        runs.append((f"duty {duty:g}", *measure(monitor, kind, args.seconds, env)))
    for limit in args.limits:
        assert node is not None
        runs.append(
            (f"limit {limit:g}", *measure(monitor, kind, args.seconds, node.pod_env(limit)))
        )
    unlimited.append(("unlimited", *measure(monitor, kind, args.seconds, plain)))
    base_rate = statistics.mean(rate for _, rate, _, _ in unlimited)
    base_batch = statistics.mean(batch for _, _, batch, _ in unlimited)
    base_active = statistics.mean(figures["active"] for _, _, _, figures in unlimited) / 100
    for label, rate, batch, figures in [unlimited[0], *runs, unlimited[1]]:
        line: dict[str, Any] = {
            "workload": kind,
            "run": label,
            "share": round(100 * rate / base_rate, 2),
        }
        if not label.startswith("limit"):
            line["batch_ms"] = round(batch, 3)
        print(json.dumps(line | figures), flush=True)
    gains: dict[str, float] = {}
    active_gains: dict[str, float] = {}
    for label, _, batch, figures in runs:
        if label.startswith("duty"):
            duty = float(label.split()[1])
            gains[label] = round(base_batch / batch, 4)
            # The share of a paced batch's time a kernel ran: the GPU's active share over the
            # run, over the share of the run the program spent in batches.
            active = min(1.0, figures["active"] / 100 / duty)
            active_gains[label] = round(base_batch * base_active / (batch * active), 4)
    print(json.dumps({"workload": kind, "gain": gains, "active_gain": active_gains}), flush=True)


if __name__ == "__main__":
    main()
