"""The rules every shipped shared object follows, checked on the file, for any architecture.

A preload library is loaded into programs of any image, old or new, Python or not: it may ask
glibc for nothing newer than 2.17 (manylinux2014, and aarch64's first glibc), need only libc,
libdl and libpthread, carry no RPATH/RUNPATH, and reference no Python symbol.

    python build_support/native_check.py --arch aarch64 LIB.so...
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
from elftools.elf.sections import SymbolTableSection

GLIBC_FLOOR = (2, 17)
ALLOWED_NEEDED = frozenset({"libc.so.6", "libdl.so.2", "libpthread.so.0"})
MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}
_PYTHON_SYMBOL = re.compile(r"^_?Py[A-Z_]")


def problems(path: Path, arch: str, also_needed: frozenset[str] = frozenset()) -> list[str]:
    """What is wrong with one ELF file; empty when it follows every rule. ``also_needed`` names
    libraries it may need besides libc, libdl and libpthread."""
    try:
        with path.open("rb") as handle:
            return _problems(ELFFile(handle), arch, ALLOWED_NEEDED | also_needed)
    except (OSError, ELFError) as error:
        return [f"cannot read as ELF: {error}"]


def _problems(elf: ELFFile, arch: str, allowed: frozenset[str]) -> list[str]:
    found: list[str] = []
    if elf["e_machine"] != MACHINES[arch]:
        found.append(f"built for {elf['e_machine']}, not {arch}")
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            for tag in section.iter_tags():
                # pyelftools sets the decoded string as an attribute named after the tag.
                needed = getattr(tag, "needed", None)
                if tag.entry.d_tag == "DT_NEEDED" and needed not in allowed:
                    found.append(f"NEEDED {needed} (only {', '.join(sorted(allowed))})")
                if tag.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"):
                    found.append(
                        f"{tag.entry.d_tag[3:]} {getattr(tag, tag.entry.d_tag[3:].lower())}"
                    )
        elif isinstance(section, GNUVerNeedSection):
            for _, auxiliaries in section.iter_versions():
                for auxiliary in auxiliaries:
                    found += _version_problem(auxiliary.name)
        elif isinstance(section, SymbolTableSection) and section.name == ".dynsym":
            for symbol in section.iter_symbols():
                if symbol["st_shndx"] == "SHN_UNDEF" and _PYTHON_SYMBOL.match(symbol.name):
                    found.append(f"references Python symbol {symbol.name}")
    return found


def _version_problem(name: str) -> list[str]:
    if not name.startswith("GLIBC_"):
        return []
    if name == "GLIBC_PRIVATE":
        return ["uses GLIBC_PRIVATE symbols"]
    version = tuple(int(part) for part in name.removeprefix("GLIBC_").split("."))
    if version > GLIBC_FLOOR:
        return [f"needs {name} (newer than GLIBC_{'.'.join(map(str, GLIBC_FLOOR))})"]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=sorted(MACHINES), required=True)
    parser.add_argument("--also-needed", action="append", default=[], metavar="SONAME")
    parser.add_argument("libraries", nargs="+", type=Path)
    options = parser.parse_args(argv)
    failed = 0
    for library in options.libraries:
        found = problems(library, options.arch, frozenset(options.also_needed))
        failed += bool(found)
        for problem in found:
            print(f"{library}: {problem}", file=sys.stderr)
        if not found:
            needed = ", ".join(sorted(ALLOWED_NEEDED | set(options.also_needed)))
            print(
                f"{library}: ok ({options.arch}, glibc <= 2.17, NEEDED within {needed}, "
                "no RPATH, no Python)"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
