"""Running vgpu-sim-workload (and small Python probes) in subprocesses on a simulated node."""

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vgpu_limiter import sim

# Relative tolerance of timings against the simulated GPU time; wide enough for a loaded CI
# machine, narrow enough to catch a kernel that runs twice, not at all or concurrently.
TOLERANCE = 0.05
GiB = 1 << 30
MiB = 1 << 20
CONTEXT_OVERHEAD = 512 * MiB  # the simulator's default per-process context cost

Report = dict[str, Any]


def workload(environment: dict[str, str], *args: str, timeout: float = 60) -> Report:
    """Run the workload to the end; its JSON report, successful or not (see "error")."""
    result = subprocess.run(
        [str(sim.workload_path()), *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.stdout.count("\n") == 1, (result.stdout, result.stderr)
    report: Report = json.loads(result.stdout)
    assert (result.returncode == 0) == ("error" not in report), (result.returncode, report)
    report["returncode"] = result.returncode
    return report


def succeed(environment: dict[str, str], *args: str, timeout: float = 60) -> Report:
    report = workload(environment, *args, timeout=timeout)
    assert "error" not in report, report
    return report


def start(environment: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(sim.workload_path()), *args],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 60) -> Report:
    stdout, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 0, (stdout, stderr)
    report: Report = json.loads(stdout)
    return report


@contextmanager
def holding(
    environment: dict[str, str], *args: str
) -> Iterator[tuple[subprocess.Popen[str], Report]]:
    """A workload that keeps its memory (--hold) while the block runs; killed afterwards.

    Its report comes before the hold, so reading it is the signal that the memory is held.
    """
    process = start(environment, *args, "--hold", "120")
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else ""
        report: Report = json.loads(line)
        assert "error" not in report, report
        yield process, report
    finally:
        # SIGTERM ends the hold and the workload frees what it holds (SIGKILL is for tests).
        process.terminate()
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate(timeout=30)


def python(environment: dict[str, str], script: str, timeout: float = 60) -> Any:
    """Run a Python script in a subprocess; it prints one JSON value, which is returned."""
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def near(measured: float, expected: float, tolerance: float = TOLERANCE) -> bool:
    return abs(measured - expected) <= tolerance * expected
