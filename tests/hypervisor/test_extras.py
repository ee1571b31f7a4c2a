"""The Kubernetes parts come with an extra: a daemon asked for them without it says in one line
what to install (the build session checks a real bare-metal install too)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hypervisor.conftest import clean_environment, daemon_files

# Run the CLI as if the extra's modules were not installed (None in sys.modules: not importable).
WITHOUT = (
    "import sys\n"
    "for name in ('grpc', 'lightkube'):\n"
    "    sys.modules[name] = None\n"
    "from vgpu_hypervisor.cli import main\n"
    "sys.argv[0] = 'tf-hypervisor'\n"
    "main()\n"
)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--device-plugin"], "--device-plugin"),
        (["--kubernetes"], "--kubernetes"),
        (["--token-review", "--token-review-url", "http://127.0.0.1:9/x"], "--token-review"),
    ],
)
def test_a_daemon_asked_for_a_kubernetes_part_without_the_extra_says_what_to_install(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT,
            "daemon",
            "--simulate",
            *daemon_files(tmp_path),
            *flags,
        ],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert named in result.stderr
    assert "(lightkube, grpc not installed): pip install 'vgpu-hypervisor[kubernetes]'" in (
        result.stderr
    )
    assert not (tmp_path / "shm").exists()  # nothing started
