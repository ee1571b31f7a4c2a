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
    assert result.stderr == f"error: no-such-command: no such command (see '{command} --help')\n"


@pytest.mark.parametrize(
    ("command", "words", "expected"),
    [
        ("tf-hypervisor", "tf-hypervisor pods de", {"describe", "delete"}),
        ("tf-limiter", "tf-limiter ch", {"check-config"}),
        ("tf-add-path", "tf-add-path ex", {"exec"}),
    ],
)
def test_shell_completion(command: str, words: str, expected: set[str]) -> None:
    """What typer's installed bash completion asks the command, answered by the command."""
    executable = Path(sys.executable).with_name(command)
    variable = "_" + command.upper().replace("-", "_") + "_COMPLETE"
    result = subprocess.run(
        [str(executable)],
        env={
            "PATH": "/usr/bin:/bin",
            variable: "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - 1),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == expected
