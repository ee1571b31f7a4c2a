"""A short run of benchmarks/limiter_stress.py: racing allocations through every API and call
path, SIGKILLs and restarts never take the pod past its limit and leak nothing; without the
limiter, the same race is seen passing it."""

import json
import subprocess
import sys
from pathlib import Path

from tests.limiter.conftest import PRELOAD

BENCHMARK = Path(__file__).parents[2] / "benchmarks" / "limiter_stress.py"
SHORT = ("--processes", "4", "--threads", "2", "--seconds", "3", "--kill-rate", "4")
SMALL = ("--limit", "2GiB", "--max-alloc", "256MiB")


def stress(*options: str) -> tuple[list[dict[str, object]], dict[str, object]]:
    """The per-API lines and the summary of one run."""
    result = subprocess.run(
        [sys.executable, str(BENCHMARK), *SHORT, *SMALL, "--preload", PRELOAD, *options],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.stderr == ""  # the workers tell the first unexpected CUDA error there
    return lines[:-1], lines[-1]


def test_a_short_stress_run_stays_within_the_limit_and_leaks_nothing() -> None:
    apis, summary = stress()
    assert summary["max_over_limit_device_bytes"] == 0
    assert summary["max_over_limit_region_bytes"] == 0
    assert summary["leaked_device_bytes"] == 0
    assert summary["leaked_region_bytes"] == 0
    assert summary["whole_limit_allocatable_after"] is True
    assert summary["calls_failed"] == 0
    # Not a vacuous pass: workers were killed, every API was driven, and the pod was full.
    killed = summary["processes_killed"]
    assert isinstance(killed, int) and killed >= 1
    assert summary["processes_started"] == 4 + killed
    assert summary["exit_statuses"] == {"0": 4}
    assert all(isinstance(line["tried"], int) and line["tried"] > 0 for line in apis), apis
    refused = summary["allocations_refused"]
    assert isinstance(refused, int) and refused > 0
    samples = summary["monitor_samples"]
    assert isinstance(samples, int) and samples > 0


def test_without_the_limiter_the_monitor_sees_the_race_pass_the_limit() -> None:
    _, summary = stress("--without-limiter")
    over = summary["max_over_limit_device_bytes"]
    assert isinstance(over, int) and over > 0
    assert summary["leaked_device_bytes"] == 0  # the driver frees what dead processes held
