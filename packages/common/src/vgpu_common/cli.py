"""Conventions every vgpu command-line tool follows."""

import sys
from typing import NoReturn

# Exit codes: 2 for bad input (as argparse and click), 126/127 as shells use them.
USAGE_ERROR = 2
CANNOT_EXECUTE = 126
NOT_FOUND = 127


def fail(message: str, code: int = USAGE_ERROR) -> NoReturn:
    """Report a problem as one line on stderr and exit with a non-zero code."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)
