"""Facts about a built shared object, read with binutils (present wherever gcc is)."""

import re
import subprocess
from pathlib import Path


def _run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def undefined_symbols(library: Path) -> set[str]:
    return {
        line.split()[-1].split("@")[0]
        for line in _run("nm", "-D", "--undefined-only", str(library)).splitlines()
        if line.strip()
    }


def exported_symbols(library: Path) -> set[str]:
    """Defined dynamic symbols of the library itself (functions and data)."""
    symbols = set()
    for line in _run("nm", "-D", "--defined-only", str(library)).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in {"T", "D", "B", "R", "W", "V"}:
            symbols.add(parts[2].split("@")[0])
    return symbols


def dynamic_entries(library: Path, tag: str) -> list[str]:
    """Values of one dynamic-section tag, e.g. NEEDED → ["libc.so.6"]."""
    pattern = re.compile(rf"\({tag}\)\s+.*\[(.*)\]")
    return [
        m.group(1)
        for line in _run("readelf", "-d", str(library)).splitlines()
        if (m := pattern.search(line))
    ]


def newest_glibc_version(library: Path) -> tuple[int, ...]:
    """The newest GLIBC_x.y symbol version the library asks for."""
    versions = {
        tuple(int(n) for n in v.split("."))
        for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", _run("objdump", "-T", str(library)))
    }
    return max(versions, default=(0,))


def dynamic_flags(library: Path) -> set[str]:
    """Words of the FLAGS entry of the dynamic section, e.g. {"SYMBOLIC", "BIND_NOW"}."""
    flags: set[str] = set()
    for line in _run("readelf", "-d", str(library)).splitlines():
        if "(FLAGS)" in line:
            flags.update(line.split("(FLAGS)", 1)[1].split())
    return flags
