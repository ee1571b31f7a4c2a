"""Cost of the memory limiter on an allocation + free pair, on the simulated GPU.

Builds benchmarks/alloc_pair.c against the simulated libcuda.so.1 and runs it in alternating
rounds without and with libcuda_limiter.so (a 40 GiB limit, so every pair is charged and given
back), printing one JSON line with the medians and their ratio.
Usage: python benchmarks/limiter_alloc.py [--rounds N] [--pairs N]
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from vgpu_limiter import library_path, sim

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parent / "packages" / "limiter" / "csrc" / "include"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pairs", type=int, default=100000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vgpu-alloc-"))
    program = work / "alloc_pair"
    subprocess.run(
        [
            "cc",
            "-O2",
            "-std=c11",
            f"-I{INCLUDE}",
            str(HERE / "alloc_pair.c"),
            "-o",
            str(program),
            f"-L{sim.library_dir()}",
            "-l:libcuda.so.1",
        ],
        check=True,
    )
    base = os.environ | sim.environment(state=work / "node.state")
    limited = base | {
        "LD_PRELOAD": str(library_path()),
        "SHM_PATH": str(work / "pod"),
        "TENSOR_FUSION_CUDA_MEM_LIMIT": '{"0": "40GiB"}',
    }
    samples: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(args.rounds):
        for name, environment in (("without", base), ("with", limited)):
            result = subprocess.run(
                [str(program), str(args.pairs)],
                env=environment,
                capture_output=True,
                text=True,
                check=True,
            )
            samples[name].append(json.loads(result.stdout)["ns_per_pair"])
    without = statistics.median(samples["without"])
    with_limiter = statistics.median(samples["with"])
    print(
        json.dumps(
            {
                "benchmark": "limiter_alloc_pair",
                "device": "simulated",
                "pairs": args.pairs,
                "rounds": args.rounds,
                "ns_per_pair_without": round(without, 1),
                "ns_per_pair_with": round(with_limiter, 1),
                "added_ns_per_pair": round(with_limiter - without, 1),
                "ratio": round(with_limiter / without, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
