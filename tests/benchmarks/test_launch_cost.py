"""benchmarks/limiter_launch_gpu.py on the simulated GPU: it builds its C loop against the
simulator, runs every case, and reports the paced path's host cost per launch as one JSON line.
The figures are the simulator's (no speed is asserted): what is checked is that each case ran
and was measured."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from vgpu_limiter import library_path

BENCHMARK = Path(__file__).parents[2] / "benchmarks" / "limiter_launch_gpu.py"


def report_of(*options: str) -> dict[str, Any]:
    """The benchmark's JSON line, run on the simulated GPU with the installed library."""
    result = subprocess.run(
        [
            *(sys.executable, str(BENCHMARK), "--simulated", "--library", str(library_path())),
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def test_the_launch_benchmark_runs_on_the_simulated_gpu() -> None:
    report = report_of("--limited", "99", "--rounds", "1", "--launches", "2000")
    assert report["measure"] == "launch_cost"
    assert set(report["in_process"]) == {"none", "library", "limit_100", "limit_99"}
    assert all(value > 0 for value in report["ns_per_launch"].values())


def test_compare_alternates_builds_of_the_paced_path(tmp_path: Path) -> None:
    other = tmp_path / "other.so"
    other.write_bytes(library_path().read_bytes())
    report = report_of(
        *("--limited", "99", "--rounds", "2", "--launches", "1000", "--compare", f"other={other}")
    )
    assert report["measure"] == "launch_cost_paired"
    assert set(report["builds"]) == {"library", "other"}
    assert all(len(build["rounds_ns"]) == 2 for build in report["builds"].values())


def test_compare_needs_a_limit_and_names() -> None:
    for extra in (["--compare", "other=x.so"], ["--limited", "99", "--compare", "x.so"]):
        result = subprocess.run(
            [sys.executable, str(BENCHMARK), "--simulated", "--library", "x.so", *extra],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode != 0
        assert "--compare" in result.stderr
