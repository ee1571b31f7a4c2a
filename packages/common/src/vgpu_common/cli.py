"""Conventions every vgpu command-line tool follows."""

import os
import shutil
import sys
from collections.abc import Mapping
from typing import NoReturn

# Exit codes: 2 for bad input (as argparse and click), 126/127 as shells use them.
USAGE_ERROR = 2
CANNOT_EXECUTE = 126
NOT_FOUND = 127


def fail(message: str, code: int = USAGE_ERROR) -> NoReturn:
    """Report a problem as one line on stderr and exit with a non-zero code."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def exec_command(
    command: list[str], environment: Mapping[str, str], search_path: str | None = None
) -> NoReturn:
    """Replace this process by `command`, found in `search_path` (default: the environment's
    PATH) when it names no folder. Failures are one line: 127 not found, 126 cannot run."""
    program = command[0]
    if "/" not in program:
        path = search_path if search_path is not None else environment.get("PATH", os.defpath)
        found = shutil.which(program, path=path)
        if found is None:
            fail(f"{program}: command not found", NOT_FOUND)
        program = found
    try:
        os.execve(program, command, environment)
    except FileNotFoundError:
        fail(f"{command[0]}: no such file", NOT_FOUND)
    except OSError as error:
        fail(f"cannot run {command[0]}: {error.strerror}", CANNOT_EXECUTE)
