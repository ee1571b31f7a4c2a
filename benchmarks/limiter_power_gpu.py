"""SM clock and power of a real GPU while a workload runs under the compute limiter.

Tells apart what the limiter meters (GPU time) from what the GPU's power management does with
the idle time a limit leaves: each case runs one workload of benchmarks/limiter_compute_gpu.py
(unlimited, or under a limit) while NVML is read every millisecond or so, and prints one JSON
line per case over the steady part of the run (the last seconds but one):
  rate               work per second (the workload's own count)
  sm_clock_mhz       10th, 50th and 90th percentile of the SM clock
  power_w            mean power from the energy counter; `instant_w` the percentiles of the
                     instantaneous reading, `updates_ms` how often the energy counter moved
  reasons            how often each clock event reason mask was seen (0x4: software power cap)
and, for limited cases, `speed_while_active`: the rate per unit of GPU time relative to the
unlimited run (the limiter gives the pod exactly L of the time, so this is rate / (L * unlimited)).
Usage: python benchmarks/limiter_power_gpu.py --library libcuda_limiter.so
       [--kinds matmul elementwise] [--limits 10 25 50 75] [--seconds 8]
"""

import argparse
import importlib.util
import itertools
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import pynvml

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("compute", HERE / "limiter_compute_gpu.py")
assert _spec is not None and _spec.loader is not None
compute = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compute)

INSTANT = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", 186)


def read(handle: Any) -> tuple[float, int, int, int, int, int]:
    """(time, SM clock MHz, energy mJ, instantaneous power mW or -1, clock event reasons,
    NVML's GPU utilization %)."""
    now = time.perf_counter()
    clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    energy = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    try:
        field = pynvml.nvmlDeviceGetFieldValues(handle, [INSTANT])[0]
        instant = field.value.uiVal if field.nvmlReturn == 0 else -1
    except pynvml.NVMLError:
        instant = -1
    try:
        reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except pynvml.NVMLError:
        reasons = -1
    utilization = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
    return now, clock, energy, instant, reasons, utilization


def percentiles(values: list[float]) -> list[float]:
    ordered = sorted(values)
    return [ordered[int(f * (len(ordered) - 1))] for f in (0.1, 0.5, 0.9)]


def case(handle: Any, kind: str, env: dict[str, str], seconds: int) -> dict[str, Any]:
    samples = []
    process = subprocess.Popen(
        compute.command(kind, seconds),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while process.poll() is None:
        samples.append(read(handle))
        time.sleep(0.001)
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{kind}: {err[-800:]}")
    end = samples[-1][0]
    steady = [s for s in samples if end - seconds / 2 - 1 <= s[0] <= end - 1]
    span = steady[-1][0] - steady[0][0]
    moves = [s[0] for a, s in itertools.pairwise(steady) if s[2] != a[2]]
    reasons: dict[str, int] = {}
    for sample in steady:
        reasons[hex(sample[4])] = reasons.get(hex(sample[4]), 0) + 1
    instant = [s[3] / 1000 for s in steady if s[3] >= 0]
    windows = compute.windows(json.loads(out)["marks"], seconds)
    return {
        "rate": round(statistics.mean(windows[1:]), 1),
        "sm_clock_mhz": percentiles([float(s[1]) for s in steady]),
        "power_w": round((steady[-1][2] - steady[0][2]) / span / 1000, 1),
        "instant_w": [round(v, 1) for v in percentiles(instant)] if instant else None,
        "updates_ms": round(
            1000 * statistics.median(b - a for a, b in itertools.pairwise(moves)), 1
        )
        if len(moves) > 2
        else None,
        "reasons": reasons,
        "utilization_pct": round(statistics.mean(s[5] for s in steady), 1),
        "window_power_w": window_power(steady),
    }


def window_power(samples: list[tuple[float, int, int, int, int, int]]) -> list[float]:
    """Mean power over consecutive 200-ms windows (what a daemon polling NVML would see)."""
    out, first = [], samples[0]
    for sample in samples:
        if sample[0] - first[0] >= 0.2:
            out.append(round((sample[2] - first[2]) / (sample[0] - first[0]) / 1000, 1))
            first = sample
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True)
    parser.add_argument("--kinds", nargs="*", default=["matmul", "elementwise"])
    parser.add_argument("--limits", nargs="*", type=float, default=[10, 25, 50, 75])
    parser.add_argument("--seconds", type=int, default=8)
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    idle = [read(handle) for _ in range(2)]
    time.sleep(2)
    idle.append(read(handle))
    print(
        json.dumps(
            {
                "measure": "device",
                "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
                "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "idle_power_w": round(
                    (idle[-1][2] - idle[0][2]) / (idle[-1][0] - idle[0][0]) / 1000, 1
                ),
                "idle_sm_clock_mhz": idle[-1][1],
            }
        ),
        flush=True,
    )
    node = compute.Node(str(Path(args.library).resolve()))
    for kind in args.kinds:
        unlimited = case(handle, kind, node.plain, args.seconds)
        print(
            json.dumps({"measure": "power", "workload": kind, "limit": None, **unlimited}),
            flush=True,
        )
        for limit in args.limits:
            row = case(handle, kind, node.pod_env(limit), args.seconds)
            speed = row["rate"] / (limit / 100 * unlimited["rate"])
            print(
                json.dumps(
                    {
                        "measure": "power",
                        "workload": kind,
                        "limit": limit,
                        "pct_of_unlimited": round(100 * row["rate"] / unlimited["rate"], 2),
                        "speed_while_active": round(speed, 3),
                        **row,
                    }
                ),
                flush=True,
            )
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
