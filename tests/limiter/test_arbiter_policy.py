"""The lease arbiter's policy (arbiter_policy.c) through its C test, built plainly here (the
sanitize session builds it again under ASan and UBSan): who is served next, when a holder loses
the lease, how long a party that overran is served last, what each client is told."""

import subprocess
from pathlib import Path

from tests.limiter.conftest import C_TESTS

REGION_C = Path(__file__).resolve().parents[2] / "packages/limiter/csrc"


def test_the_arbiter_policy_c_tests_pass(tmp_path: Path) -> None:
    program = tmp_path / "arbiter_policy_test"
    subprocess.run(
        [
            *("cc", "-std=c11", "-Wall", "-Wextra", "-Werror"),
            *(f"-I{REGION_C / 'region'}", f"-I{REGION_C / 'include'}"),
            str(C_TESTS / "arbiter_policy_test.c"),
            str(REGION_C / "region/arbiter_policy.c"),
            *("-o", str(program)),
        ],
        check=True,
    )
    result = subprocess.run([program], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(" passed, 0 failed"), result.stdout
    assert int(result.stdout.split()[0]) >= 25
