"""Size limits of the project's C sources: no file over 600 lines, no function over 80.

    python scripts/check_c_sizes.py [FOLDER ...]   one line per offender, exit 1 if any

Without folders it checks every .c and .h file of packages/limiter/csrc and
packages/add_path/csrc. A function counts from the first line of its signature to its closing
brace. Functions are found by a plain scan (comments, literals and preprocessor lines blanked,
braces matched): a top-level `{` after a parameter list (and attributes), with no `=` since the
previous declaration, opens a function body. Functions that a macro defines (inside #define)
are not seen.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FOLDERS = (ROOT / "packages/limiter/csrc", ROOT / "packages/add_path/csrc")
C_SUFFIXES = (".c", ".h")

# Comments, string and character literals, and preprocessor lines (with their continuations).
_CODE_NOISE = re.compile(
    r"""/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|^[ \t]*\#(?:\\\n|[^\n])*""",
    re.DOTALL | re.MULTILINE,
)
_NOT_NAMES = {"__attribute__", "__declspec", "_Alignas", "__typeof__", "typeof"}


@dataclass(frozen=True)
class Function:
    name: str
    first_line: int
    last_line: int

    @property
    def lines(self) -> int:
        return self.last_line - self.first_line + 1


@dataclass(frozen=True)
class Offence:
    path: Path
    what: str  # "" for the file itself, else the function's name
    lines: int
    limit: int

    def __str__(self) -> str:
        subject = f"{self.path}" if not self.what else f"{self.path}: {self.what}()"
        return f"{subject}: {self.lines} lines (limit {self.limit})"


def _blank(match: re.Match[str]) -> str:
    # Keep the newlines, so that offsets still map to the same line numbers.
    return "".join("\n" if char == "\n" else " " for char in match.group(0))


def code_only(source: str) -> str:
    """The source with comments, literals and preprocessor lines blanked (newlines kept)."""
    return _CODE_NOISE.sub(_blank, source)


def _parameter_list(header: str, end: int) -> int | None:
    """Where the parenthesized group that closes at header[end - 1] opens, or None."""
    depth = 0
    for offset in range(end - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(header[offset], 0)
        if depth == 0:
            return offset
    return None


def _signature(header: str) -> tuple[str, int] | None:
    """The name a top-level definition's header defines and the offset where its signature
    starts (after the last blank line before the name), or None when it is no function."""
    if "=" in header:
        return None
    end = len(header.rstrip())
    while end > 0 and header[end - 1] == ")":
        opening = _parameter_list(header, end)
        if opening is None:
            return None
        name = re.search(r"([A-Za-z_]\w*)\s*$", header[:opening])
        if name is None:
            return None
        if name.group(1) not in _NOT_NAMES:
            blank = 0
            for gap in re.finditer(r"\n[ \t]*\n", header[: name.start()]):
                blank = gap.end()
            start = blank + len(header[blank:]) - len(header[blank:].lstrip())
            return name.group(1), start
        end = len(header[: name.start()].rstrip())  # an attribute after the parameters
    return None


def functions(source: str) -> Iterator[Function]:
    """Every top-level function definition of a C source, in order."""
    code = code_only(source)
    depth = 0
    header_start = 0  # offset where the current top-level declaration began
    body: tuple[str, int] | None = None  # the open function's name and first offset
    for offset, char in enumerate(code):
        if char == "{":
            if depth == 0:
                signature = _signature(code[header_start:offset])
                if signature is not None:
                    name, start = signature
                    body = (name, header_start + start)
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                if body is not None:
                    name, first = body
                    yield Function(
                        name, code.count("\n", 0, first) + 1, code.count("\n", 0, offset) + 1
                    )
                    body = None
                header_start = offset + 1
        elif char == ";" and depth == 0:
            header_start = offset + 1


def c_files(folders: Iterable[Path]) -> list[Path]:
    return sorted(
        path for folder in folders for path in folder.rglob("*") if path.suffix in C_SUFFIXES
    )


def offences(path: Path) -> list[Offence]:
    source = path.read_text(encoding="utf-8")
    found = []
    line_count = source.count("\n") + (0 if source.endswith("\n") or not source else 1)
    if line_count > MAX_FILE_LINES:
        found.append(Offence(path, "", line_count, MAX_FILE_LINES))
    found += [
        Offence(path, function.name, function.lines, MAX_FUNCTION_LINES)
        for function in functions(source)
        if function.lines > MAX_FUNCTION_LINES
    ]
    return found


def main(arguments: list[str]) -> int:
    folders = [Path(argument) for argument in arguments] or list(DEFAULT_FOLDERS)
    found = [offence for path in c_files(folders) for offence in offences(path)]
    for offence in found:
        print(offence)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
