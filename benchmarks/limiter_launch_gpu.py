"""Cost of the limiter on the kernel launch path, on a real GPU, without Python in the loop.

Builds benchmarks/launch_loop.c against the machine's libcuda.so.1 (our own declarations, no
toolkit) and runs it in alternating rounds: no preload, the library with no compute limit, the
library with a limit of 100, and (with --control) another preload library without CUDA hooks.
Prints one JSON line: per case the median over rounds of the mean time per launch (bound by the
GPU's rate for empty kernels) and of the median host time of one cuLaunchKernel call (where
the hooks' own cost shows), with differences and ratios to no preload. Within each process the
program also alternates batches through the driver's own cuLaunchKernel, which no preload
intercepts: "in_process" compares the two ways side by side in one process, free of the spread
between process launches (for "none" both are the driver, a check on the method).
Usage: python benchmarks/limiter_launch_gpu.py --library libcuda_limiter.so [--control X.so]
       [--rounds 9] [--launches 200000] [--batch 64] [--limited 99] [--simulated]
       [--evict BYTES] [--compare NAME=LIBRARY ...]
With --compare (and --limited), only the limited case runs, for --library (named "library") and
each other build named, alternating build by build in every round: the builds' in-process
added ns per call side by side, as medians and every round's figure. Builds of one machine
drift by ±15 % over minutes, so comparing them takes many rounds alternated like this.
With --simulated it runs on the simulated GPU (no GPU needed): the simulator's launch is the
baseline, so only the hooks' and the paced path's own work shows, not the real driver's calls.
The simulator's launch also leaves the hooks' data and code in the CPU's caches, where a real
driver's does not: --evict 4194304 (past a server CPU's L2 of 2-4 MB) writes that much memory
between two calls, and the paced path then costs on the simulated GPU about what it costs on an
H100.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from vgpu_limiter import sim

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parent / "packages" / "limiter" / "csrc" / "include"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True)
    parser.add_argument("--control")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--repeat-library",
        action="store_true",
        help="run the no-limit library case twice a round, last too (to see order effects)",
    )
    parser.add_argument(
        "--limited",
        type=int,
        help="also under this compute limit (99: pacing barely waits, so the host cost of the "
        "paced launch path shows)",
    )
    parser.add_argument("--launches", type=int, default=200000)
    parser.add_argument(
        "--simulated", action="store_true", help="build and run against the simulated GPU"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=64,
        help="launches between synchronizes; well under the launch queue's depth, so that a "
        "call's time is the host's work and not a wait for room in the queue",
    )
    parser.add_argument(
        "--evict",
        type=int,
        default=0,
        help="bytes written between two calls, outside their timing, to leave the CPU's caches "
        "as cold as a real driver's launch does (use --launches 20000: it is slow)",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="NAME=LIBRARY",
        help="only the --limited case, this library and these builds alternating per round",
    )
    args = parser.parse_args()
    if args.compare and not args.limited:
        parser.error("--compare needs --limited: it compares the paced launch path")
    work = Path(tempfile.mkdtemp(prefix="vgpu-launch-"))
    program = work / "launch_loop"
    subprocess.run(
        [
            "cc",
            "-O2",
            "-std=c11",
            f"-I{INCLUDE}",
            str(HERE / "launch_loop.c"),
            "-o",
            str(program),
            "-l:libcuda.so.1",
            *([f"-L{sim.library_dir()}"] if args.simulated else []),
        ],
        check=True,
    )
    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if args.simulated:
        plain |= sim.environment(state=work / "node.state", base=plain)
    library = str(Path(args.library).resolve())
    cases = {
        "none": plain,
        "library": plain | {"LD_PRELOAD": library, "SHM_PATH": str(work / "pod-a")},
        "limit_100": plain
        | {
            "LD_PRELOAD": library,
            "SHM_PATH": str(work / "pod-b"),
            "TENSOR_FUSION_CUDA_UP_LIMIT": '{"0": 100}',
        },
    }
    if args.compare:
        compare(args, program, plain, work)
        return
    if args.limited:
        cases[f"limit_{args.limited}"] = cases["limit_100"] | {
            "SHM_PATH": str(work / "pod-d"),
            "TENSOR_FUSION_CUDA_UP_LIMIT": json.dumps({"0": args.limited}),
        }
    if args.control:
        cases["control"] = plain | {"LD_PRELOAD": str(Path(args.control).resolve())}
    if args.repeat_library:
        cases["library_last"] = cases["library"] | {"SHM_PATH": str(work / "pod-c")}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    calls: dict[str, list[float]] = {name: [] for name in cases}
    call_added: dict[str, list[float]] = {name: [] for name in cases}
    launch_ratio: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, env in cases.items():  # alternating: drift hits every case alike
            report = run_loop(program, args, env)
            samples[name].append(report["ns_per_launch"])
            calls[name].append(report["call_ns_median"])
            call_added[name].append(report["call_ns_median"] - report["direct_call_ns_median"])
            launch_ratio[name].append(report["direct_ns_per_launch"] / report["ns_per_launch"])
    medians = {name: statistics.median(values) for name, values in samples.items()}
    call_medians = {name: statistics.median(values) for name, values in calls.items()}
    print(
        json.dumps(
            {
                "measure": "launch_cost",
                "rounds": args.rounds,
                "launches": args.launches,
                "ns_per_launch": {k: round(v, 1) for k, v in medians.items()},
                "added_ns": {
                    k: round(v - medians["none"], 1) for k, v in medians.items() if k != "none"
                },
                "call_ns_median": {k: round(v, 1) for k, v in call_medians.items()},
                "call_added_ns": {
                    k: round(v - call_medians["none"], 1)
                    for k, v in call_medians.items()
                    if k != "none"
                },
                "throughput_ratio": {
                    k: round(medians["none"] / v, 4) for k, v in medians.items() if k != "none"
                },
                "in_process": {
                    name: {
                        "call_added_ns": round(statistics.median(call_added[name]), 1),
                        "throughput_ratio": round(statistics.median(launch_ratio[name]), 4),
                    }
                    for name in cases
                },
            }
        ),
        flush=True,
    )


def run_loop(program: Path, args: argparse.Namespace, env: dict[str, str]) -> dict[str, float]:
    """One run of the C loop under `env`: its JSON report."""
    out = subprocess.run(
        [str(program), str(args.launches), str(args.batch), str(args.evict)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    report: dict[str, float] = json.loads(out)
    return report


def compare(args: argparse.Namespace, program: Path, plain: dict[str, str], work: Path) -> None:
    """The --limited case of each build in turn, every round: in-process added ns per call."""
    builds = {"library": str(Path(args.library).resolve())}
    for item in args.compare:
        name, separator, path = item.partition("=")
        if not separator or not name or not path:
            raise SystemExit(f"--compare {item!r}: expected NAME=LIBRARY")
        builds[name] = str(Path(path).resolve())
    added: dict[str, list[float]] = {name: [] for name in builds}
    for round_number in range(args.rounds):
        for name, library in builds.items():
            env = plain | {
                "LD_PRELOAD": library,
                "SHM_PATH": str(work / f"pod-{name}-{round_number}"),
                "TENSOR_FUSION_CUDA_UP_LIMIT": json.dumps({"0": args.limited}),
            }
            report = run_loop(program, args, env)
            added[name].append(report["call_ns_median"] - report["direct_call_ns_median"])
    print(
        json.dumps(
            {
                "measure": "launch_cost_paired",
                "limit": args.limited,
                "rounds": args.rounds,
                "launches": args.launches,
                "builds": {
                    name: {"median_ns": statistics.median(values), "rounds_ns": values}
                    for name, values in added.items()
                },
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
