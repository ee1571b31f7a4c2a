"""The pacing state's lock (compute_lock.h) through its C test, built plainly here (the sanitize
session builds it again under ASan and UBSan): one holder at a time among threads that hold it
briefly and threads that sleep holding it, a try that fails while it is held, and a waiter that
sleeps on the word, is interrupted by a signal and is woken when it is let go, the program's
errno untouched."""

import re
import subprocess
from pathlib import Path

from tests.limiter.conftest import build_unit_test

LIMITER_C = Path(__file__).parents[2] / "packages/limiter/csrc"


def test_the_lock_c_tests_pass(tmp_path: Path) -> None:
    program = build_unit_test(
        "compute_lock_test",
        [LIMITER_C / "limiter/compute_lock.c"],
        [LIMITER_C / "limiter"],
        tmp_path,
    )
    result = subprocess.run([program], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    counts = re.fullmatch(r"(\d+) passed, 0 failed\n", result.stdout)
    assert counts is not None and int(counts[1]) >= 30, result.stdout
