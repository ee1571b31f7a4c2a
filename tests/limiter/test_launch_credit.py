"""A thread's credit of paced launches (compute_credit.h) on the simulated GPU: launches of short
kernels mostly go without the paced path, and the pod still gets its limit; long kernels never
go on credit. The pacing log (debug) counts the launches made on credit."""

import re
from pathlib import Path

import pytest

from tests.limiter.conftest import LimitedEnv
from tests.limiter.test_compute_limits import share

TOLERANCE_PP = 3.0
STATS = re.compile(r"pacing: .*?, (\d+) launches \((\d+) on credit\)")


def paced(
    environment: dict[str, str], log: Path, limit: int, kernel_us: int, *options: str
) -> tuple[float, int, int]:
    """The share the workload got, and the launches and those on credit the pacing log says."""
    environment = environment | {"TF_LOG_LEVEL": "debug", "TF_LOG_PATH": str(log)}
    got = share(environment, limit, *options, seconds=3.0, kernel_us=kernel_us)
    counts = [(int(m[1]), int(m[2])) for m in STATS.finditer(log.read_text())]
    assert counts, log.read_text()[-2000:]
    return got, sum(c[0] for c in counts), sum(c[1] for c in counts)


@pytest.mark.parametrize("options", [(), ("--fresh-streams", "--batch", "25")])
def test_short_kernels_go_on_credit_and_the_limit_holds(
    compute_env: LimitedEnv, tmp_path: Path, options: tuple[str, ...]
) -> None:
    got, launches, credited = paced(compute_env(), tmp_path / "log", 25, 20, *options)
    assert got == pytest.approx(25, abs=TOLERANCE_PP)
    assert credited > launches // 2, (launches, credited)


def test_long_kernels_never_go_on_credit(compute_env: LimitedEnv, tmp_path: Path) -> None:
    got, launches, credited = paced(compute_env(), tmp_path / "log", 25, 1000)
    assert got == pytest.approx(25, abs=TOLERANCE_PP)
    assert launches > 0 and credited == 0


def test_a_pod_under_its_limit_that_synchronizes_and_idles_is_not_charged_its_gaps(
    compute_env: LimitedEnv,
) -> None:
    """Rounds of eight 20-µs kernels, each waited for and followed by 0.5 ms on the host: under
    a fifth of the GPU, under a limit of 50. The synchronization counts the launches made on
    credit and its marker covers them, so the gap after it is idle, not the pod's: it keeps its
    own rate (the build before credit gave the same)."""
    rounds = ("--batch", "8", "--idle-ms", "0.5")
    natural = share(compute_env(), None, *rounds, seconds=3.0, kernel_us=20)
    limited = share(compute_env(), 50, *rounds, seconds=3.0, kernel_us=20)
    assert limited >= 0.85 * natural, (limited, natural)
