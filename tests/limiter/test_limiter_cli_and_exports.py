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


def test_run_refuses_what_the_library_would_refuse(limited_env: LimitedEnv) -> None:
    for arguments, message in (
        (["--mem", "0=4XB"], 'bad size "4XB"'),
        (["--mem", "0"], "expected DEV=VALUE"),
        (["--compute", "0=250"], "--compute 0=250: bad percent"),
        (["--mem", "0=4XB"], "--mem 0=4XB: "),
        (["--pod", "a/b/../c"], "POD_"),
    ):
        result = run([TF_LIMITER, "run", *arguments, "--", "true"], limited_env(preload=False))
        assert result.returncode == 2, (arguments, result.stderr)
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1
