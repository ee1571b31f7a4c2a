"""Every package's command-line entry point is installed and runs."""

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("command", "distribution"),
    [("tf-limiter", "vgpu-limiter"), ("tf-hypervisor", "vgpu-hypervisor")],
)
def test_version(command: str, distribution: str) -> None:
    executable = Path(sys.executable).with_name(command)
    result = subprocess.run(
        [str(executable), "version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{version(distribution)}\n"


@pytest.mark.parametrize(
    ("command", "distribution"),
    [
        ("tf-add-path", "vgpu-add-path"),
        ("tf-limiter", "vgpu-limiter"),
        ("tf-hypervisor", "vgpu-hypervisor"),
    ],
)
def test_version_flag(command: str, distribution: str) -> None:
    executable = Path(sys.executable).with_name(command)
    result = subprocess.run(
        [str(executable), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{command} {version(distribution)}\n"


@pytest.mark.parametrize("command", ["tf-add-path", "tf-limiter", "tf-hypervisor"])
def test_unknown_command_is_a_usage_error(command: str) -> None:
    executable = Path(sys.executable).with_name(command)
    result = subprocess.run(
        [str(executable), "no-such-command"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "No such command" in result.stderr
