"""Cost of preloading libadd_path.so into short-lived processes, as a ratio to not preloading.

Runs `sh -c :` many times in alternating order without the library, with it and no TF_*
variables, and with it rewriting all three variables, then prints one JSON line per case.
Usage: python benchmarks/add_path_load.py [--runs N]
"""

import argparse
import json
import statistics
import subprocess
import time

from vgpu_add_path import library_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="process starts per case")
    args = parser.parse_args()
    library = str(library_path())
    base = {"PATH": "/usr/bin:/bin"}
    cases = {
        "no_library": base,
        "library_no_tf_vars": base | {"LD_PRELOAD": library},
        "library_rewriting": base
        | {
            "LD_PRELOAD": library,
            "TF_PREPEND_PATH": "/opt/a:/opt/b",
            "TF_PATH": "/opt/c",
            "TF_LD_LIBRARY_PATH": "/opt/lib",
            "TF_LD_PRELOAD": library,
        },
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, environment in cases.items():  # interleaved, so drift hits every case alike
            start = time.perf_counter()
            subprocess.run(["/bin/sh", "-c", ":"], env=environment, check=True)
            samples[name].append(time.perf_counter() - start)
    baseline = statistics.median(samples["no_library"])
    for name, values in samples.items():
        median = statistics.median(values)
        print(
            json.dumps(
                {
                    "benchmark": "add_path_load",
                    "case": name,
                    "runs": args.runs,
                    "median_us": round(median * 1e6, 1),
                    "ratio_to_no_library": round(median / baseline, 3),
                }
            )
        )


if __name__ == "__main__":
    main()
