"""The C sources stay small enough to read: no file over 600 lines, no function over 80
(scripts/check_c_sizes.py), in every C file of packages/limiter/csrc and
packages/add_path/csrc."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from check_c_sizes import (
    DEFAULT_FOLDERS,
    MAX_FILE_LINES,
    MAX_FUNCTION_LINES,
    ROOT,
    c_files,
    functions,
    offences,
)

SCRIPT = ROOT / "scripts" / "check_c_sizes.py"


def test_no_c_file_or_function_is_too_long() -> None:
    found = [str(offence) for path in c_files(DEFAULT_FOLDERS) for offence in offences(path)]
    assert found == []


def test_the_scan_finds_hooks_and_skips_macro_uses() -> None:
    compute = ROOT / "packages/limiter/csrc/limiter/compute.c"
    names = {function.name for function in functions(compute.read_text())}
    assert {"paced", "cuStreamDestroy_v2", "vgpu_compute_quiesce", "vgpu_compute_paced"} <= names
    # A macro's use (VGPU_EX_HOOK(cuLaunchKernelEx, false)) defines no function the scan sees.
    assert not {"VGPU_KERNEL_HOOK", "VGPU_EX_HOOK", "cuLaunchKernelEx"} & names
    assert len(c_files(DEFAULT_FOLDERS)) > 50


SOURCE = """\
#include "x.h"  /* { not a brace */
#define MACRO(name) int name(void) { return 0; }
static const int table[] = {1, 2, 3};
struct point { int x; int y; };

/* A comment with } and { in it. */
static int
add(int a,
    int b) {
    const char *text = "}{";
    char brace = '}';
    if (a) {
        return b + text[0] + brace;
    }
    return a + b;
}
MACRO(made)

void attribute(void) __attribute__((cold));
__attribute__((cold)) void attribute(void) {
}
"""


def test_functions_span_signature_to_closing_brace() -> None:
    found = [(f.name, f.first_line, f.last_line) for f in functions(SOURCE)]
    assert found == [("add", 7, 16), ("attribute", 20, 21)]


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def _long_function(lines: int) -> str:
    """A function of exactly `lines` lines."""
    return "int f(void) {\n" + "    ;\n" * (lines - 2) + "}\n"


@pytest.mark.parametrize(
    ("text", "offending"),
    [
        (_long_function(MAX_FUNCTION_LINES), False),
        (_long_function(MAX_FUNCTION_LINES + 1), True),
        ("\n" * MAX_FILE_LINES, False),
        ("\n" * (MAX_FILE_LINES + 1), True),
        ("int x;\n" * MAX_FILE_LINES + "int y;", True),  # a last line without its newline
    ],
)
def test_the_script_exits_non_zero_past_a_limit(tmp_path: Path, text: str, offending: bool) -> None:
    path = _write(tmp_path / "csrc", "a.c", text)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "csrc")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == (1 if offending else 0), result.stdout
    assert (str(path) in result.stdout) == offending
