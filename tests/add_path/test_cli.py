"""tf-add-path: path, env and exec through the installed entry point."""

import subprocess
import sys
from pathlib import Path

import pytest

TF_ADD_PATH = str(Path(sys.executable).with_name("tf-add-path"))
BASE = {"PATH": "/usr/bin:/bin"}


def tf_add_path(
    *args: str, environment: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TF_ADD_PATH, *args],
        env=BASE if environment is None else environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_path_prints_the_library(libadd_path: Path) -> None:
    result = tf_add_path("path")
    assert result.returncode == 0
    assert result.stdout == f"{libadd_path}\n"


def test_exec_prepends_and_appends() -> None:
    result = tf_add_path(
        "exec",
        "--prepend",
        "PATH=/opt/a",
        "--append",
        "PATH=/opt/b",
        "--",
        "sh",
        "-c",
        "echo $PATH",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "/opt/a:/usr/bin:/bin:/opt/b\n"


def test_exec_keeps_flag_order_and_existing_tf_values() -> None:
    environment = BASE | {"TF_LD_LIBRARY_PATH": "/first"}
    result = tf_add_path(
        "exec",
        "--prepend",
        "PATH=/a",
        "--prepend",
        "PATH=/b",
        "--append",
        "LD_LIBRARY_PATH=/second",
        "--",
        "sh",
        "-c",
        'echo "$PATH $LD_LIBRARY_PATH"',
        environment=environment,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "/a:/b:/usr/bin:/bin /first:/second\n"


def test_exec_finds_the_program_in_a_prepended_folder(tmp_path: Path) -> None:
    program = tmp_path / "hello-vgpu"
    program.write_text("#!/bin/sh\necho hello from $0\n")
    program.chmod(0o755)
    result = tf_add_path("exec", "--prepend", f"PATH={tmp_path}", "--", "hello-vgpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"hello from {program}\n"


def test_exec_passes_arguments_that_look_like_options() -> None:
    result = tf_add_path("exec", "--", "sh", "-c", 'echo "$@"', "sh", "--append", "-x")
    assert result.stdout == "--append -x\n"


def test_env_lines_enable_the_library_in_a_shell(libadd_path: Path) -> None:
    script = (
        f'eval "$("{TF_ADD_PATH}" env --prepend PATH=/opt/a)"; sh -c \'echo "$PATH|$LD_PRELOAD"\''
    )
    result = subprocess.run(
        ["sh", "-c", script], env=BASE, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"/opt/a:/usr/bin:/bin|{libadd_path}\n"


def test_env_keeps_an_existing_preload(libadd_path: Path) -> None:
    result = tf_add_path("env", environment=BASE | {"LD_PRELOAD": "/other.so"})
    assert result.stdout == f"export LD_PRELOAD=/other.so:{libadd_path}\n"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ["exec", "--append", "PYTHONPATH=/x", "--", "true"],
            2,
            "error: --append 'PYTHONPATH=/x': expected VAR=VALUE",
        ),
        (["env", "--prepend", "PATH"], 2, "error: --prepend 'PATH': expected VAR=VALUE"),
        (
            ["exec", "--", "no-such-program-vgpu"],
            127,
            "error: no-such-program-vgpu: command not found",
        ),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args: list[str], code: int, message: str) -> None:
    result = tf_add_path(*args)
    assert result.returncode == code
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_exec_of_a_file_that_cannot_run(tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("not a program\n")
    data.chmod(0o644)
    result = tf_add_path("exec", "--", str(data))
    assert result.returncode == 126
    assert result.stderr == f"error: cannot run {data}: Permission denied\n"


def test_exec_without_a_command_is_a_usage_error() -> None:
    result = tf_add_path("exec")
    assert result.returncode == 2
    assert (
        result.stderr
        == "error: missing argument '-- CMD [ARG]...' (see 'tf-add-path exec --help')\n"
    )
