"""Scheduling between pods (issue 13), each result printed as one JSON line.

Every scenario runs its pods at once, side by side with the same pods unlimited in the same run
(the unlimited column), and reports each pod's share of the GPU: its work per second while all
ran, over the work per second of one unlimited program alone.
  shares   30/70, 30/30 and 20/30/50
  idle     a busy 30/70 pair beside pods that exist and launch nothing: one idle 50 % pod, then
           six more (25, 50, 25, 50, 25, 50), as a user leaves pods made over a day
  light    a busy 30/70 pair beside a 50 % pod that uses about a sixth of the GPU in short
           rounds (the bursty program): the pair shares what it leaves, the GPU stays busy
  burst    a pod at 30 with burst 100 alone, then with a 70 % pod starting: its share alone and
           the pair's from 1 s after the start; and such a pod of two processes alone
  bursty   an inference-like pod (8-10 ms of work, 40 ms idle) alone, then beside a training pod
           (hard 50, burst 100): the training pod's share and the bursty pod's p50/p99 latency
  weights  oversubscribed: 60/60 of equal class, 60 high against 60 low (the scheduler's rule,
           daemon/scheduler.py, published into the regions as the daemon does)
  freeze   how long after a freeze the pod's last work finished (p50, p99), short kernels
On a GPU the workload is a bf16 4096³ matmul loop (PyTorch); with --sim, the simulated GPU's
workload (500 µs kernels; 50 µs for freeze).
Pods stay once made, as a user's do: every scenario runs beside the finished pods of the ones
before it, which want the GPU no more and must take nothing from it.
With --daemon the node daemon (tf-hypervisor) runs throughout on the pods' base path: it adopts
the benchmark's regions, publishes the weights itself (its pod passes), freezes through its API,
and its boost correction applies (on the simulated GPU only when VGPU_SIM_ACTIVE_POWER_W exceeds
the 700 W limit). Without it the benchmark publishes the weights and freezes the regions itself.
Every line says "daemon": whether it ran. Beside each pod's share (work done), "charged" is the
GPU time its region was charged over the same window and "throttled" the time its launches waited
(both in percent of the window, sampled from the regions), so a shortfall shows whether the pod
lacked GPU time or did less work with the time it had.
Usage: python benchmarks/scheduling_gpu.py [--library path/to/libcuda_limiter.so] [--sim]
       [--daemon] [--only …]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import limiter_compute_gpu as gpu
from vgpu_common.limits import Qos
from vgpu_hypervisor.daemon.scheduler import effective_limits, weight_of
from vgpu_hypervisor.gpu import nvml
from vgpu_limiter import library_path, sim
from vgpu_limiter.lease import DeviceLease
from vgpu_limiter.region import (
    DeviceLimits,
    RegionError,
    create_region,
    open_region,
)

SIM_KERNEL_US = 500
NAMESPACE = "bench"


class Bench:
    def __init__(
        self, library: str, simulated: bool, seconds: int, logs: Path | None = None
    ) -> None:
        self.library = library
        self.logs = logs
        self.unlimited = True  # run the unlimited column
        self.simulated = simulated
        self.seconds = seconds
        self.work = Path(tempfile.mkdtemp(prefix="vgpu-sched-"))
        self.base = self.work / "base"
        self.pods = 0
        self.daemon: gpu.Daemon | None = None
        plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        if simulated:
            # One device, so that the daemon's simulated node matches the pods'.
            plain |= sim.environment(devices="1", state=self.work / "node.state", base=plain)
        self.plain = plain
        self.uuid = self._uuid()

    def start_daemon(self) -> None:
        extra = (
            ["--simulate", "--sim-state", self.plain["VGPU_SIM_STATE"]] if self.simulated else []
        )
        self.daemon = gpu.start_daemon(self.work, self.base, self.plain, extra)

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()

    def emit(self, record: dict[str, Any]) -> None:
        print(json.dumps(record | {"daemon": self.daemon is not None}), flush=True)

    def _uuid(self) -> str:
        if self.simulated:
            return "GPU-5157a1e0-0000-4000-8000-000000000001"
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    def pod(self, limit: float | None, burst: float = 0, qos: int = Qos.MEDIUM) -> dict[str, str]:
        """A fresh pod's environment; its region made first when it has a burst or a class."""
        self.pods += 1
        # {base}/{namespace}/{pod}: where the daemon finds (adopts) a pod's region.
        folder = self.base / NAMESPACE / f"pod{self.pods}"
        env = self.plain | {"LD_PRELOAD": self.library, "SHM_BASE_PATH": str(self.base)}
        env["SHM_PATH"] = str(folder)
        if self.logs is not None:  # the limiter's pacing statistics, once a second per process
            self.logs.mkdir(parents=True, exist_ok=True)
            env |= {"TF_LOG_LEVEL": "debug", "TF_LOG_PATH": str(self.logs / f"pod{self.pods}.log")}
        if limit is not None:
            hundredths = round(limit * 100)
            limits = DeviceLimits(0, hundredths, round(burst * 100))
            with create_region(
                folder / "shm", NAMESPACE, folder.name, {self.uuid: limits}
            ) as region:
                region.set_policy(qos)
        return env

    def counters(self, envs: list[dict[str, str]]) -> "Counters":
        paths = [Path(env["SHM_PATH"]) / "shm" for env in envs]
        return Counters(self.uuid, paths, self.base, nvml_device=None if self.simulated else 0)

    def start(
        self,
        env: dict[str, str],
        seconds: float,
        kernel_us: int = SIM_KERNEL_US,
        bursty: bool = False,
    ) -> Any:
        """A workload: the matmul loop, or with ``bursty`` about 8-10 ms of work then 40 ms idle
        (an inference-like program, whose rounds' latency the report gives)."""
        started = time.time()
        if self.simulated:
            command = [str(sim.workload_path()), "--duration", str(seconds), "--marks"]
            # Short kernels in small rounds, so that the freeze's marks are fine-grained.
            batch = "2" if kernel_us < SIM_KERNEL_US else "10"
            if bursty:
                kernel_us, batch = 1000, "10"
                command += ["--idle-ms", "40"]
            command += ["--kernel-us", str(kernel_us), "--batch", batch]
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
            return (process, started, kernel_us)
        return (gpu.start("bursty" if bursty else "matmul", int(seconds), env), started, 0)

    def collect(self, handle: Any) -> dict[str, Any]:
        process, started, kernel_us = handle
        if not self.simulated:
            return gpu.collect(process, self.seconds + 60)
        out, _ = process.communicate(timeout=self.seconds + 120)
        report = json.loads(out)
        # Marks in GPU-seconds of work, so that the rates are shares of the device directly.
        marks = [[t, k * kernel_us * 1e-6] for t, k in report["marks"]]
        latency = {k: report[k] for k in ("round_ms_p50", "round_ms_p99") if k in report}
        return {"marks": marks, "started": started} | latency

    def together(self, envs: list[dict[str, str]]) -> list[float]:
        return self.together_counted(envs)[0]

    def together_counted(
        self, envs: list[dict[str, str]], bursty: Sequence[bool] = ()
    ) -> tuple[list[float], list[tuple[float, float]], dict[str, float]]:
        """The pods' rates while all ran, each limited pod's (charged, throttled) percent of
        that window, from its region's counters, and the mean boost published meanwhile with
        NVML's readings. ``bursty``: which of them run the bursty program."""
        counters = self.counters(
            [env for env in envs if "SHM_PATH" in env and (Path(env["SHM_PATH"]) / "shm").exists()]
        )
        flags = list(bursty) + [False] * (len(envs) - len(bursty))
        handles = [
            self.start(env, self.seconds, bursty=b) for env, b in zip(envs, flags, strict=True)
        ]
        try:
            reports = [self.collect(h) for h in handles]
        finally:
            counters.stop()
        rates = gpu.overlap_rates(reports, self.seconds)
        begin = max(report["started"] for report in reports)
        end = min(report["started"] for report in reports) + self.seconds
        gpu_view = {
            "boost": counters.boost(begin, end),
            "boost_per_s": counters.boosts_per_second(begin, end),
        } | counters.nvml(begin, end)
        return rates, counters.percent(begin, end), gpu_view

    def baseline(self) -> float:
        if self.simulated:
            return 1.0  # a GPU-second of work per second
        (rate,) = self.together([self.plain])
        return rate


class Counters:
    """Samples the pods' region counters (GPU time charged, time throttled), the boost the
    daemon publishes for the GPU and, on a real GPU, NVML's utilization and SM clock every 50 ms,
    with the wall-clock time, until stopped."""

    def __init__(self, uuid: str, paths: list[Path], base: Path, nvml_device: int | None) -> None:
        self.uuid = uuid
        self.paths = paths
        self.base = base
        self.nvml_device = nvml_device
        self.samples: list[list[tuple[float, int, int]]] = [[] for _ in paths]
        self.boosts: list[tuple[float, float]] = []
        self.readings: list[tuple[float, int, int]] = []  # (time, utilization %, SM MHz)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        regions = [open_region(path, writable=False) for path in self.paths]
        try:
            lease = DeviceLease.open(self.base, self.uuid)
        except RegionError:
            lease = None  # no boost to read (no node file)
        handle = self._nvml_handle()
        try:
            while True:
                if handle is not None:
                    rates, clock = nvml.device_utilization(handle), nvml.device_sm_clock(handle)
                    if isinstance(rates, tuple) and isinstance(rates[0], int):
                        self.readings.append(
                            (time.time(), rates[0], clock if isinstance(clock, int) else 0)
                        )
                for region, samples in zip(regions, self.samples, strict=True):
                    device = region.device(self.uuid)
                    samples.append((time.time(), device.gpu_ns, device.throttled_ns))
                if lease is not None:
                    self.boosts.append((time.time(), lease.boost() or 1.0))
                if self._stop.wait(0.05):
                    return
        finally:
            for region in regions:
                region.close()
            if lease is not None:
                lease.close()

    def _nvml_handle(self) -> Any:
        if self.nvml_device is None:
            return None
        try:
            nvml.initialize()
        except Exception:  # no NVML: nothing to read
            return None
        handle = nvml.device_handle(self.nvml_device)
        return None if handle is nvml.NOT_AVAILABLE else handle

    def nvml(self, begin: float, end: float) -> dict[str, float]:
        """NVML's mean utilization (%) and SM clock (MHz) over the window, where read."""
        window = [(busy, clock) for at, busy, clock in self.readings if begin <= at <= end]
        if not window:
            return {}
        return {
            "nvml_busy": round(statistics.mean(b for b, _ in window), 1),
            "sm_mhz": round(statistics.mean(c for _, c in window)),
        }

    def boost(self, begin: float, end: float) -> float:
        """The mean boost published over the window (1: none)."""
        values = [value for at, value in self.boosts if begin <= at <= end]
        return round(statistics.mean(values), 3) if values else 1.0

    def boosts_per_second(self, begin: float, end: float) -> list[float]:
        """The mean boost published in each whole second of the window."""
        return [self.boost(begin + k, begin + k + 1) for k in range(int(end - begin))]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def percent(self, begin: float, end: float) -> list[tuple[float, float]]:
        def at(samples: list[tuple[float, int, int]], t: float, field: int) -> float:
            before = [s for s in samples if s[0] <= t] or samples[:1]
            after = [s for s in samples if s[0] >= t] or samples[-1:]
            a, b = before[-1], after[0]
            if b[0] == a[0]:
                return float(a[field])
            return a[field] + (b[field] - a[field]) * (t - a[0]) / (b[0] - a[0])

        span = (end - begin) * 1e9
        return [
            (
                round(100 * (at(s, end, 1) - at(s, begin, 1)) / span, 1),
                round(100 * (at(s, end, 2) - at(s, begin, 2)) / span, 1),
            )
            for s in self.samples
        ]


def pct(rate: float, baseline: float) -> float:
    return round(100 * rate / baseline, 1)


SHARES = ([30, 70], [30, 30], [20, 30, 50])


def shares(bench: Bench, base: float, sets: list[list[int]] | None = None) -> None:
    for limits in sets or SHARES:
        unlimited = bench.together([bench.pod(None) for _ in limits]) if bench.unlimited else []
        limited, counted, gpu_view = bench.together_counted([bench.pod(limit) for limit in limits])
        bench.emit(
            {
                "scenario": "shares",
                "limits": limits,
                "unlimited": [pct(r, base) for r in unlimited],
                "limited": [pct(r, base) for r in limited],
                "busy": round(sum(pct(r, base) for r in limited), 1),
                "charged": [c for c, _ in counted],
                "throttled": [t for _, t in counted],
            }
            | gpu_view
        )


def idle(bench: Bench, base: float) -> None:
    """A busy 30/70 pair beside pods that exist and launch nothing."""
    for case, idle_limits in (("one idle pod", [50]), ("six more idle", [25, 50, 25, 50, 25, 50])):
        for limit in idle_limits:
            bench.pod(limit)  # made, never used
        limited, counted, gpu_view = bench.together_counted([bench.pod(30), bench.pod(70)])
        bench.emit(
            {
                "scenario": "idle",
                "case": case,
                "limits": [30, 70],
                "idle_limits": idle_limits,
                "limited": [pct(r, base) for r in limited],
                "busy": round(sum(pct(r, base) for r in limited), 1),
                "charged": [c for c, _ in counted],
                "throttled": [t for _, t in counted],
            }
            | gpu_view
        )


def light(bench: Bench, base: float) -> None:
    """A busy 30/70 pair beside a 50 % pod that uses about a sixth of the GPU: divided by that
    pod's whole limit, the pair got 20 / 46 and the GPU sat a fifth idle."""
    envs = [bench.pod(30), bench.pod(70), bench.pod(50)]
    limited, counted, gpu_view = bench.together_counted(envs, bursty=[False, False, True])
    bench.emit(
        {
            "scenario": "light",
            "limits": [30, 70, 50],
            "limited": [pct(r, base) for r in limited[:2]],
            "light_charged": counted[2][0],
            "busy": round(sum(pct(r, base) for r in limited[:2]) + counted[2][0], 1),
            "charged": [c for c, _ in counted],
            "throttled": [t for _, t in counted],
        }
        | gpu_view
    )


def _latency(report: dict[str, Any]) -> dict[str, float]:
    """A bursty program's rounds: p50 and p99 in ms (the simulated workload gives them)."""
    if "round_ms_p50" in report:
        return {"p50_ms": report["round_ms_p50"], "p99_ms": report["round_ms_p99"]}
    rounds = sorted(report["round_ms"][1:])  # the first pays for warm-up
    # Where the tail came from: the slowest rounds, each as [its end in s from the program's
    # start, its time in ms].
    ends = [mark[0] for mark in report["marks"]]
    slowest = sorted(zip(ends[1:], report["round_ms"][1:], strict=True), key=lambda r: -r[1])[:5]
    return {
        "p50_ms": round(rounds[len(rounds) // 2], 2),
        "p99_ms": round(rounds[min(len(rounds) - 1, len(rounds) * 99 // 100)], 2),
        "rounds": len(rounds),
        "slowest": [[round(end, 2), round(ms, 2)] for end, ms in slowest],
        # The program's start on CLOCK_MONOTONIC, in ms: the limiter's debug log's clock.
        "monotonic_start_ms": round(1000 * report.get("monotonic_start", 0.0)),
    }


def bursty(bench: Bench, base: float) -> None:
    """An inference-like pod (limit 50: about 8 ms of work, then 40 ms idle) alone, then beside a
    training pod (hard 50, burst 100): the training pod's share, which should take what the
    bursty one leaves, and the bursty pod's round latency beside it against alone. Then the
    same with a burst of 100 for the inference pod too (each bursting pod counted at what it
    uses: the training pod was held to 50 when both had a burst)."""
    for infer_burst in (0, 100):
        infer_env = bench.pod(50, burst=infer_burst)
        alone = bench.collect(bench.start(infer_env, bench.seconds, bursty=True))
        train_env = bench.pod(50, burst=100)
        handles = [
            bench.start(train_env, bench.seconds),
            bench.start(infer_env, bench.seconds, bursty=True),
        ]
        train, infer = (bench.collect(handle) for handle in handles)
        (trained,) = gpu.overlap_rates([train], bench.seconds)
        bench.emit(
            {
                "scenario": "bursty",
                "train_limits": [50, 100],
                "infer_limits": [50, infer_burst or 50],
                "train": pct(trained, base),
                "infer_alone": _latency(alone),
                "infer_beside": _latency(infer),
                # On the inference program's clock (its "slowest" rounds'), when the training
                # program's measured loop began.
                "train_began_s": round(train["started"] - infer["started"], 2),
            }
        )


def launching(counters: Counters, started: Any) -> None:
    """Wait until the pod the counters watch (its first) has launched work: its start-up
    (imports, CUDA context) is not its time alone."""
    deadline = time.monotonic() + 60
    while not counters.samples[0] or counters.samples[0][-1][1] == 0:
        if time.monotonic() > deadline or started[0].poll() is not None:
            raise RuntimeError("the bursting pod never launched")
        time.sleep(0.05)


def rate(report: dict[str, Any], begin: float, end: float) -> float:
    """Kernels per second a workload's report says it finished between `begin` and `end`
    (seconds from its start)."""
    return (gpu.done_at(report["marks"], end) - gpu.done_at(report["marks"], begin)) / (end - begin)


def wake(bench: Bench, base: float) -> None:
    """A pod at 30 (burst 100) runs beside a light pod (50, the inference-like program) long
    enough for the daemon to publish it a burst rate; then a 70 % pod wakes. Its share in its
    first quarter seconds: before the arbiter told bursting pods of a pod that woke, they kept
    a rate counted without it until the daemon's next pass (up to a second)."""
    alone = 3
    env, light_env = bench.pod(30, burst=100), bench.pod(50)
    counters = bench.counters([env])
    first = bench.start(env, alone + bench.seconds + 10)
    lighter = bench.start(light_env, alone + bench.seconds + 10, bursty=True)
    launching(counters, first)
    time.sleep(alone)
    with open_region(Path(env["SHM_PATH"]) / "shm", writable=False) as region:
        rate_before = region.burst(0)
    second = bench.start(bench.pod(70), bench.seconds)
    try:
        b = bench.collect(second)
        bench.collect(first)
        bench.collect(lighter)
    finally:
        counters.stop()

    bench.emit(
        {
            "scenario": "wake",
            "limits": [30, 70],
            "burst": 100,
            "light_limit": 50,
            "burst_rate_before": round(rate_before / 100, 1),
            "woken_per_250ms": [pct(rate(b, k / 4, (k + 1) / 4), base) for k in range(8)],
            "woken_first_s": pct(rate(b, 0, 1), base),
            "woken_per_s": [pct(rate(b, k, k + 1), base) for k in range(bench.seconds)],
        }
    )


def burst(bench: Bench, base: float) -> None:
    alone = 3
    env = bench.pod(30, burst=100)
    counters = bench.counters([env])
    # Long enough to outlast the second pod, whose start-up (imports) takes a few seconds.
    first = bench.start(env, alone + bench.seconds + 10)
    # Alone means before the second pod's process exists: its start-up (CUDA context, warm-up
    # launches) already contends for the GPU. So the first must be launching before the clock
    # of its time alone starts.
    launching(counters, first)
    time.sleep(alone)
    second_launched = time.time()
    second = bench.start(bench.pod(70), bench.seconds)
    try:
        b = bench.collect(second)
        a = bench.collect(first)
    finally:
        counters.stop()
    offset = b["started"] - a["started"]
    alone_end = second_launched - a["started"]
    if alone_end < 1.5:
        raise RuntimeError(f"the bursting pod ran alone for {alone_end:.1f} s only")

    settled = offset + 1.0
    end = min(offset + bench.seconds, a["marks"][-1][0])
    ((charged_alone, _),) = counters.percent(a["started"] + 0.5, second_launched)
    ((charged_with, _),) = counters.percent(a["started"] + settled, a["started"] + end)
    bench.emit(
        {
            "scenario": "burst",
            "limit": 30,
            "burst": 100,
            "alone": pct(rate(a, 0.5, alone_end), base),
            "alone_charged": charged_alone,
            "alone_seconds": round(alone_end - 0.5, 2),
            "with_70_from_1s": [
                pct(rate(a, settled, end), base),
                pct(rate(b, settled - offset, end - offset), base),
            ],
            "charged_with_70": charged_with,
            "per_100ms_after_start": [
                pct(rate(a, offset + k / 10, offset + (k + 1) / 10), base) for k in range(10)
            ],
            # The 70 % pod's every second from its start: how soon the bursting pod gives way.
            "second_pod_per_s": [pct(rate(b, k, k + 1), base) for k in range(int(end - offset))],
        }
    )
    # A pod of two processes, alone: its own processes are no contention, so together they
    # reach its soft limit.
    env = bench.pod(30, burst=100)
    together = bench.together([env, env])
    bench.emit(
        {
            "scenario": "burst",
            "case": "one pod of two processes, alone",
            "limit": 30,
            "burst": 100,
            "shares": [pct(r, base) for r in together],
            "pod": round(sum(pct(r, base) for r in together), 1),
        }
    )


def publisher(bench: Bench, pods: list[tuple[dict[str, str], int, int]]) -> Callable[[], None]:
    """Publish the scheduler's effective limits into the pods' regions every 0.5 s (as the
    daemon does each pass) until the returned function is called."""
    stop = threading.Event()

    def publish() -> None:
        wanted = {env["SHM_PATH"]: (limit * 100, weight_of(qos, 0)) for env, limit, qos in pods}
        effective = effective_limits(wanted)
        while not stop.is_set():
            for folder, value in effective.items():
                with open_region(Path(folder) / "shm") as region:
                    region.set_effective(0, value)
            stop.wait(0.5)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()

    def finish() -> None:
        stop.set()
        thread.join()

    return finish


def published(envs: list[dict[str, str]], timeout: float = 10.0) -> list[float]:
    """The effective limits (%) the daemon published into the pods' regions, once it has
    published one for every pod (its pod pass runs every second at most)."""
    deadline = time.monotonic() + timeout
    while True:
        values = []
        for env in envs:
            with open_region(Path(env["SHM_PATH"]) / "shm") as region:
                values.append(region.effective(0) / 100)
        if all(values) or time.monotonic() > deadline:
            return values
        time.sleep(0.1)


def weights(bench: Bench, base: float) -> None:
    for name, classes in (("equal", [Qos.MEDIUM, Qos.MEDIUM]), ("high_low", [Qos.HIGH, Qos.LOW])):
        pods = [(bench.pod(60, qos=qos), 60, int(qos)) for qos in classes]
        envs = [env for env, _, _ in pods]
        extra: dict[str, Any] = {}
        if bench.daemon is not None:
            # The daemon's own pass publishes the weights; the run starts once it has.
            extra["published"] = published(envs)
            limited = bench.together(envs)
        else:
            finish = publisher(bench, pods)
            try:
                limited = bench.together(envs)
            finally:
                finish()
        formula = effective_limits(
            {str(i): (6000, weight_of(qos, 0)) for i, qos in enumerate(classes)}
        )
        bench.emit(
            {
                "scenario": "weights",
                "case": name,
                "limits": [60, 60],
                "formula": [formula[str(i)] / 100 for i in range(len(classes))],
                "limited": [pct(r, base) for r in limited],
            }
            | extra
        )


def freeze(bench: Bench, base: float, count: int = 10) -> None:
    """Freeze a running pod `count` times for 0.3 s; the latency is how long after the freeze
    its last work finished (the program's marks)."""
    del base
    env = bench.pod(50)
    seconds = 1 + count * 0.6 + 1
    handle = bench.start(env, seconds, kernel_us=50)
    folder = Path(env["SHM_PATH"])
    time.sleep(1.0)
    frozen_at = []
    calls = []  # how long each freeze call took to return
    with open_region(folder / "shm") as region:
        for _ in range(count):
            frozen_at.append(time.time())
            if bench.daemon is not None:  # through its API: its passes renew freezes
                bench.daemon.post(f"/pods/{NAMESPACE}/{folder.name}/freeze")
            else:
                region.freeze(10)
            calls.append(time.time() - frozen_at[-1])
            time.sleep(0.3)
            if bench.daemon is not None:
                bench.daemon.post(f"/pods/{NAMESPACE}/{folder.name}/resume")
            else:
                region.resume()
            time.sleep(0.3)
    report = bench.collect(handle)
    marks = report["marks"]
    latencies = []
    for at in frozen_at:
        relative = at - report["started"]
        before = [t for t, _ in marks if t <= relative + 0.25]
        latencies.append(max(0.0, (before[-1] if before else relative) - relative))
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * count))]
    bench.emit(
        {
            "scenario": "freeze",
            "kernel_us": 50 if bench.simulated else "matmul",
            "freezes": count,
            "latency_ms_p50": round(1000 * statistics.median(latencies), 2),
            "latency_ms_p99": round(1000 * p99, 2),
            "call_ms_max": round(1000 * max(calls), 2),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--library",
        default=None,
        help="the limiter to preload (default: the installed one, `tf-limiter path`)",
    )
    parser.add_argument("--sim", action="store_true", help="on the simulated GPU")
    parser.add_argument(
        "--only",
        nargs="*",
        default=["shares", "idle", "light", "burst", "bursty", "wake", "weights", "freeze"],
    )
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument(
        "--shares",
        nargs="*",
        metavar="L1,L2,...",
        help="the sets of limits of the shares scenario (default: 30,70 30,30 20,30,50)",
    )
    parser.add_argument(
        "--no-unlimited",
        action="store_true",
        help="leave out the shares' unlimited column (quicker comparisons of limiter builds)",
    )
    parser.add_argument(
        "--logs",
        type=Path,
        help="a folder for each pod's limiter log at debug level (its pacing statistics)",
    )
    parser.add_argument(
        "--daemon",
        action="store_true",
        help="run the node daemon (tf-hypervisor) throughout: it adopts the pods, publishes "
        "the weights and its boost correction applies",
    )
    args = parser.parse_args()
    library = args.library or str(library_path())
    bench = Bench(str(Path(library).resolve()), args.sim, args.seconds, args.logs)
    sets = [[int(v) for v in text.split(",")] for text in args.shares or []]
    bench.unlimited = not args.no_unlimited
    if args.daemon:
        bench.start_daemon()
    try:
        base = bench.baseline()
        bench.emit({"scenario": "baseline", "simulated": args.sim, "rate_per_s": round(base, 3)})
        for name, scenario in (
            ("shares", shares),
            ("idle", idle),
            ("light", light),
            ("burst", burst),
            ("bursty", bursty),
            ("wake", wake),
            ("weights", weights),
            ("freeze", freeze),
        ):
            if name == "shares" and name in args.only:
                shares(bench, base, sets)
            elif name in args.only:
                scenario(bench, base)
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
