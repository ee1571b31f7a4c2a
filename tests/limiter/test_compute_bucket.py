"""The compute limiter's token bucket, rate choice and gang gate (compute_bucket.c) and the names
of collective kernels (collectives.c) through their C unit test, built with the plain compiler:
no simulator, no driver (nox -s sanitize runs it under ASan and UBSan too)."""

import re
import subprocess
from pathlib import Path

from tests.limiter.conftest import build_unit_test

LIMITER_C = Path(__file__).parents[2] / "packages/limiter/csrc"


def test_bucket_and_rate_unit_test_passes(tmp_path: Path) -> None:
    program = build_unit_test(
        "limiter_pacing_test",
        [LIMITER_C / "limiter/compute_bucket.c", LIMITER_C / "limiter/collectives.c"],
        [LIMITER_C / "limiter", LIMITER_C / "include"],
        tmp_path,
    )
    result = subprocess.run([program], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    counts = re.fullmatch(r"(\d+) passed, 0 failed\n", result.stdout)
    assert counts is not None and int(counts[1]) > 0, result.stdout
