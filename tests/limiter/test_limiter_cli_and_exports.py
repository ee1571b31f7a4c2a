"""The limiter exports exactly its hook table, and tf-limiter path/run work as documented."""

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.limiter.conftest import LIMITER, WORKLOAD, LimitedEnv, run
from tests.support import elf
from tests.support.cuda_table import INCLUDE, cuda_entries

HOOKS = INCLUDE.parent / "limiter" / "hooks.h"
TF_LIMITER = str(Path(sys.executable).with_name("tf-limiter"))


def hook_list(name: str) -> set[str]:
    text = HOOKS.read_text()
    block = text[text.index(f"#define {name}(X)") :].split("\n\n", 1)[0]
    return set(re.findall(r"X\((\w+)\)", block))


def test_exports_are_the_hook_table() -> None:
    cuda, nvml = hook_list("VGPU_CUDA_HOOKS"), hook_list("VGPU_NVML_HOOKS")
    assert cuda <= {entry.symbol for entry in cuda_entries()}  # every hook has a known signature
    assert all(name.startswith("nvml") for name in nvml)
    extra = {"dlsym", "vgpu_limiter_describe_config"}
    assert elf.exported_symbols(Path(LIMITER)) == cuda | nvml | extra


def test_path_prints_the_library() -> None:
    result = subprocess.run([TF_LIMITER, "path"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert result.stdout == f"{LIMITER}\n"


def test_run_applies_the_limits_and_the_pod(limited_env: LimitedEnv, tmp_path: Path) -> None:
    environment = limited_env(preload=False) | {"SHM_BASE_PATH": str(tmp_path / "base")}
    environment.pop("SHM_PATH")
    result = run(
        [
            TF_LIMITER,
            "run",
            "--mem",
            "0=2GiB",
            "--pod",
            "team-a/trainer",
            "--",
            WORKLOAD,
            "--kernels",
            "1",
            "--alloc",
            "1GiB",
        ],
        environment,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["total_bytes"] == 2 << 30
    assert (tmp_path / "base" / "team-a" / "trainer" / "shm").is_file()


def test_run_adds_its_flags_to_the_limits_the_environment_sets(limited_env: LimitedEnv) -> None:
    """Before, the flags replaced the variable whole: a GPU the variable limited ran unlimited,
    and a bad value there went unread."""
    environment = limited_env(preload=False)

    def planned(variable: str, *arguments: str) -> subprocess.CompletedProcess[str]:
        return run(
            [TF_LIMITER, "run", *arguments, "--", "sh", "-c", f'echo "${variable}"'],
            environment | {variable: '{"1": "2GiB"}'},
        )

    added = planned("TENSOR_FUSION_CUDA_MEM_LIMIT", "--mem", "0=1GiB")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout) == {"1": "2GiB", "0": "1GiB"}
    clash = planned("TENSOR_FUSION_CUDA_MEM_LIMIT", "--mem", "1=4GiB")
    assert clash.returncode == 2
    assert clash.stderr == (
        "error: --mem 1=4GiB: TENSOR_FUSION_CUDA_MEM_LIMIT sets device 1 to 2GiB "
        "(unset it, or give the same value)\n"
    )
    bad = run(
        [TF_LIMITER, "run", "--mem", "0=1GiB", "--", "true"],
        environment | {"TENSOR_FUSION_CUDA_MEM_LIMIT": '{"1": "abc"}'},
    )
    assert bad.returncode == 2 and 'bad size "abc" for key "1"' in bad.stderr


def test_run_refuses_what_the_library_would_refuse(limited_env: LimitedEnv) -> None:
    for arguments, message in (
        (["--mem", "0=4XB"], 'bad size "4XB"'),
        (["--mem", "0"], "expected DEV=VALUE"),
        (["--compute", "0=250"], "--compute 0=250: bad percent"),
        (["--mem", "0=4XB"], "--mem 0=4XB: "),
        # Named for the flag, not for the variable it becomes (POD_NAME=Bad!, before).
        (["--pod", "a/b/../c"], "--pod a/b/../c: bad pod namespace 'a/b/..'"),
        (["--pod", "Bad!"], "--pod Bad!: bad pod name 'Bad!'"),
        # The first of two dropped, before.
        (["--compute", "0=10", "--compute", "0=90"], "--compute 0=90: device 0 given twice"),
        (["--mem", "0=1GiB", "--mem", "0=2GiB"], "--mem 0=2GiB: device 0 given twice"),
    ):
        result = run([TF_LIMITER, "run", *arguments, "--", "true"], limited_env(preload=False))
        assert result.returncode == 2, (arguments, result.stderr)
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1
