"""The paced launches' clock (paced_clock.h) through its C test, built plainly here (the sanitize
session builds it again under ASan and UBSan): the CPU's counter stands for CLOCK_MONOTONIC only
within a span after each real read and once its rate is measured, a read it misses is not
measured across, a counter that keeps missing is dropped for good, and on this machine's own
counter every time it gives lies between the real reads around it."""

import re
import subprocess
from pathlib import Path

from tests.limiter.conftest import build_unit_test

LIMITER_C = Path(__file__).parents[2] / "packages/limiter/csrc"


def test_the_clock_c_tests_pass(tmp_path: Path) -> None:
    program = build_unit_test(
        "paced_clock_test", [LIMITER_C / "limiter/paced_clock.c"], [LIMITER_C / "limiter"], tmp_path
    )
    result = subprocess.run([program], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    counts = re.search(r"^(\d+) passed, 0 failed$", result.stdout, re.MULTILINE)
    assert counts is not None and int(counts[1]) >= 1000, result.stdout
