"""Where a shared GPU's time goes, read from the GPU's own clock; one JSON line per case.

Each pod runs a matmul loop (fp16 4096³, CuPy) that brackets every matmul with two one-thread
kernels writing the GPU's global timer (%globaltimer, one clock for every context on the GPU),
and synchronizes every 40 matmuls as the scheduling benchmark's loop does. The pods' intervals,
merged on that clock over the window in which all ran (less 0.5 s at each end), give, in percent
of the window:
  busy         some pod's matmul was running
  handover     gaps up to 1 ms between one pod's matmul and another's (the lease changing hands
               and the GPU switching contexts), with their count per second and p50 / p90 in µs
  own          gaps up to 1 ms between two matmuls of one pod (its synchronizations, its host,
               an epoch ending and the next starting)
  idle         gaps over 1 ms: no pod had work on the GPU (all paced, or none launching)
  overlap      two pods' matmuls ran at once: the GPU time-slicing their contexts, which the
               device lease rules out for limited pods (two unlimited loops show it)
and each pod's matmuls per second; the device lease's epochs and takeovers (leases taken from a
stale or drained holder) over the case. The bracketing kernels cost a little throughput; the
figures compare cases run alike. `--variant NAME=PATH` runs the limited cases again with another
build of the limiter (builds compared in one run), `--sets` names each set's limits, a pod's
soft limit after a colon (`30:100,70`: a pod at 30 that may burst to 100 beside one at 70),
`--leases file arbiter` runs them with the
lease files and again with the daemon's lease arbiter (lease_broker.py, started here without
the rest of the daemon), `--keep DIR` saves the intervals, `--logs DIR` keeps each pod's limiter
log at debug level (its pacing statistics once a second).
Usage: python benchmarks/handover_gpu.py --library path/to/libcuda_limiter.so
       [--variant NAME=PATH ...] [--sets 30,70 20,30,50 30:100,70] [--seconds 6] [--daemon]
       [--leases file arbiter]
"""

import argparse
import json
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import limiter_compute_gpu as gpu
from scheduling_gpu import Bench
from vgpu_limiter.lease_broker import LeaseBroker
from vgpu_limiter.region import ffi

PROGRAM = textwrap.dedent(
    """
    import json, sys, time
    import numpy, cupy
    seconds, out = float(sys.argv[1]), sys.argv[2]
    stamp = cupy.RawKernel(
        'extern "C" __global__ void stamp(unsigned long long *out, unsigned long long i) {'
        ' unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));'
        ' out[i] = t; }', "stamp")
    a = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32).astype(cupy.float16)
    b = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32).astype(cupy.float16)
    times = cupy.zeros(2 * 8000 * int(seconds + 2), dtype=cupy.uint64)
    synchronize = cupy.cuda.Device().synchronize
    for _ in range(3):
        a @ b
    synchronize()
    i, marks, start, started = 0, [], time.perf_counter(), time.time()
    while time.perf_counter() - start < seconds and i + 80 <= times.size:
        for _ in range(40):
            stamp((1,), (1,), (times, numpy.uint64(i)))
            a @ b
            stamp((1,), (1,), (times, numpy.uint64(i + 1)))
            i += 2
        synchronize()
        marks.append((time.perf_counter() - start, i // 2))
    numpy.save(out, times[:i].get())
    print(json.dumps({"marks": marks, "started": started}))
    """
)

SMALL_GAP_NS = 1_000_000
EPOCHS = ffi.offsetof("struct vgpu_device_lease", "epochs")
TAKEOVERS = ffi.offsetof("struct vgpu_device_lease", "takeovers")


def run_pods(
    bench: Bench, envs: list[dict[str, str]], seconds: int, keep: Path | None = None
) -> list[Any]:
    """Run the programs at once; each one's (start, end) intervals in GPU nanoseconds, saved
    into `keep` too when given."""
    import numpy

    program = bench.work / "handover_workload.py"
    program.write_text(PROGRAM)
    outs = [bench.work / f"times{k}.npy" for k in range(len(envs))]
    processes = [
        gpu.subprocess.Popen(
            [sys.executable, str(program), str(seconds), str(out)],
            env=env,
            stdout=gpu.subprocess.PIPE,
            stderr=gpu.subprocess.PIPE,
            text=True,
        )
        for env, out in zip(envs, outs, strict=True)
    ]
    for process in processes:
        gpu.collect(process, seconds)
    found = [numpy.load(out).reshape(-1, 2) for out in outs]
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for k, iv in enumerate(found):
            numpy.save(keep / f"{Path(bench.library).stem}_{bench.pods}_{len(envs)}_{k}.npy", iv)
    return found


def lease_counts(bench: Bench, broker: LeaseBroker | None = None) -> tuple[int, int]:
    """The GPU's lease counters (epochs, takeovers) summed over the leases in use: the
    arbiter's, the node's file under the base path, or a user's own under the temporary folder."""
    epochs = takeovers = 0
    arbitrated = broker.lease(bench.uuid) if broker is not None else None
    if arbitrated is not None:
        epochs, takeovers = arbitrated.word(EPOCHS), arbitrated.word(TAKEOVERS)
    for path in [
        bench.base / ".devices" / bench.uuid,
        *Path(tempfile.gettempdir()).glob(f"vgpu-devices-*/{bench.uuid}"),
    ]:
        if path.exists():
            data = path.read_bytes()
            epochs += int.from_bytes(data[EPOCHS : EPOCHS + 8], sys.byteorder)
            takeovers += int.from_bytes(data[TAKEOVERS : TAKEOVERS + 8], sys.byteorder)
    return epochs, takeovers


def analyse(intervals: list[Any], trim_ns: int = 500_000_000) -> dict[str, Any]:
    """The busy, hand-over, own-gap, idle and overlap figures of the window all pods ran."""
    import numpy

    begin = max(int(iv[0, 0]) for iv in intervals) + trim_ns
    end = min(int(iv[-1, 1]) for iv in intervals) - trim_ns
    span = end - begin
    if span <= 0:
        raise RuntimeError("the pods ran at the same time too briefly")
    parts = []
    for pod, found in enumerate(intervals):
        iv = found.astype(numpy.int64)
        # A bracket much longer than a matmul spans a wait of the program's thread in the
        # limiter between two of its launches (an epoch ended there): the matmul ran at one end
        # of it, next to the stamp launched without waiting. Both ends are kept, a matmul long
        # each, so what ran between (other pods, or nothing) is seen as it was.
        typical = int(numpy.median(iv[:, 1] - iv[:, 0]))
        long = iv[:, 1] - iv[:, 0] > 3 * typical
        ends = numpy.column_stack([iv[long, 1] - typical, iv[long, 1]])
        iv[long, 1] = iv[long, 0] + typical
        both = numpy.concatenate([iv, ends])
        parts.append(numpy.column_stack([both, numpy.full(len(both), pod)]))
    rows = numpy.concatenate(parts)
    rows = rows[(rows[:, 1] > begin) & (rows[:, 0] < end)]
    rows = rows[numpy.argsort(rows[:, 0], kind="stable")]
    busy = handover = own = idle = overlap = 0
    handovers: list[int] = []
    covered_to, owner = begin, -1
    for first, last, pod in rows.tolist():
        start, stop = max(first, begin), min(last, end)
        if start > covered_to:
            gap = start - covered_to
            if gap > SMALL_GAP_NS:
                idle += gap
            elif pod != owner and owner >= 0:
                handover += gap
                handovers.append(gap)
            else:
                own += gap
        elif pod != owner and owner >= 0:
            overlap += min(stop, covered_to) - start
        if stop > covered_to:
            busy += stop - max(start, covered_to)
            covered_to, owner = stop, pod
    handovers.sort()

    def pct(value: int) -> float:
        return round(100 * value / span, 2)

    def quantile(q: float) -> float:
        return round(handovers[int(q * (len(handovers) - 1))] / 1000, 1) if handovers else 0.0

    return {
        "seconds": round(span / 1e9, 2),
        "busy": pct(busy),
        "handover": pct(handover),
        "handovers_per_s": round(len(handovers) / (span / 1e9), 1),
        "handover_us_p50": quantile(0.5),
        "handover_us_p90": quantile(0.9),
        "own": pct(own),
        "idle": pct(idle),
        "overlap": pct(overlap),
        "matmuls_per_s": [
            round(float(((iv[:, 1] >= begin) & (iv[:, 1] <= end)).sum()) / (span / 1e9), 1)
            for iv in intervals
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True)
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME=PATH", help="another build"
    )
    parser.add_argument("--sets", nargs="*", default=["30,70", "20,30,50"])
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--daemon", action="store_true", help="run the node daemon throughout")
    parser.add_argument("--keep", type=Path, help="save each case's intervals here (.npy)")
    parser.add_argument("--logs", type=Path, help="the pods' limiter logs at debug level here")
    parser.add_argument(
        "--leases",
        nargs="*",
        choices=["file", "arbiter"],
        default=["file"],
        help="which device leases the pods pace with (each in turn; the daemon arbitrates its own)",
    )
    args = parser.parse_args()
    builds = [("library", args.library)]
    for variant in args.variant:
        name, _, path = variant.partition("=")
        if not path:
            parser.error(f"--variant {variant!r}: expected NAME=PATH")
        builds.append((name, path))
    for name, library in builds:
        for leases in args.leases:
            run_build(args, name, library, leases)


def parse_set(text: str) -> list[tuple[int, int] | None]:
    """A set of pods, `30,70` or with a soft limit `30:100,70`: each pod's (limit, burst)."""
    pods: list[tuple[int, int] | None] = []
    for item in text.split(","):
        limit, _, burst = item.partition(":")
        try:
            pods.append((int(limit), int(burst) if burst else 0))
        except ValueError:
            expected = "expected limits such as 30,70 or 30:100,70"
            raise SystemExit(f"--sets {text!r}: {expected}") from None
    return pods


def run_build(args: argparse.Namespace, name: str, library: str, leases: str) -> None:
    logs = args.logs / f"{name}-{leases}" if args.logs is not None else None
    bench = Bench(str(Path(library).resolve()), False, args.seconds, logs)
    broker = None
    if args.daemon:
        bench.start_daemon()
    elif leases == "arbiter":
        broker = LeaseBroker(bench.base, [bench.uuid])
        broker.start()
    try:
        cases: list[tuple[str, list[tuple[int, int] | None]]] = []
        if name == "library" and leases == args.leases[0]:  # the unlimited cases once
            cases += [("alone, unlimited", [None]), ("unlimited pair", [None, None])]
        cases += [(text, parse_set(text)) for text in args.sets]
        for label, limits in cases:
            envs = [
                bench.pod(limit[0], burst=limit[1]) if limit is not None else bench.plain
                for limit in limits
            ]
            before = lease_counts(bench, broker)
            found = analyse(run_pods(bench, envs, args.seconds, args.keep))
            after = lease_counts(bench, broker)
            found |= {"lease_epochs": after[0] - before[0], "takeovers": after[1] - before[1]}
            record = {"build": name, "leases": "arbiter" if args.daemon else leases, "case": label}
            print(json.dumps(record | found), flush=True)
    finally:
        if broker is not None:
            broker.close()
        bench.stop()


if __name__ == "__main__":
    main()
