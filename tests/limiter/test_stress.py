"""A short run of benchmarks/limiter_stress.py: racing allocations through every API and call
path, SIGKILLs and restarts never take the pod past its limit and leak nothing."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).parents[2] / "benchmarks" / "limiter_stress.py"


def test_a_short_stress_run_stays_within_the_limit_and_leaks_nothing() -> None:
    result = subprocess.run(
        [
            *(sys.executable, str(BENCHMARK), "--processes", "4", "--threads", "2"),
            *("--seconds", "3", "--kill-rate", "4", "--limit", "2GiB", "--max-alloc", "256MiB"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    summary = lines[-1]
    assert summary["max_over_limit_device_bytes"] == 0
    assert summary["max_over_limit_region_bytes"] == 0
    assert summary["leaked_device_bytes"] == 0
    assert summary["leaked_region_bytes"] == 0
    assert summary["whole_limit_allocatable_after"] is True
    assert summary["calls_failed"] == 0, result.stderr
    # Not a vacuous pass: the workers were killed, every API was driven, and the pod was full.
    assert summary["processes_killed"] >= 1
    assert summary["processes_started"] == 4 + summary["processes_killed"]
    assert summary["exit_statuses"] == {"0": 4}
    apis = {line["api"]: line for line in lines[:-1]}
    assert all(line["tried"] > 0 for line in apis.values()), apis
    assert summary["allocations_refused"] > 0
    assert summary["monitor_samples"] > 0
