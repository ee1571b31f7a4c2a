"""The library is a guest: hooked calls that succeed leave the program's errno as it was, though
the library's own work looks for files that may be absent and for processes that are gone
(tests/c/limiter_errno.c)."""

from pathlib import Path

from tests.limiter.conftest import LimitedEnv, build_program, run


def test_successful_calls_keep_errno(limited_env: LimitedEnv, tmp_path: Path) -> None:
    program = build_program("limiter_errno", tmp_path)
    # No node folder under the base path: a context's creation looks for one in vain.
    environment = limited_env('{"0": "4GiB"}', SHM_BASE_PATH=str(tmp_path / "base"))
    gone = run([str(program), "leave"], environment)
    assert gone.returncode == 0, gone.stderr
    # This one finds the first gone, still holding memory in the pod.
    result = run([str(program)], environment)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "7 passed, 0 failed"
