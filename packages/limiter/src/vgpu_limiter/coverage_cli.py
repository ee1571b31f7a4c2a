"""tf-limiter coverage: the driver's entry points against what libcuda_limiter.so intercepts."""

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from vgpu_common.cli import fail

from vgpu_limiter import library_path
from vgpu_limiter.coverage import FAMILIES, LibraryReport, compare, default_library
from vgpu_limiter.elf_symbols import ElfError, exported_functions

# Exit status when a limit-carrying entry point is not intercepted (2 stays for bad input).
GAPS_FOUND = 1

LibraryOption = Annotated[Path | None, typer.Option(metavar="LIB", dir_okay=False)]


def _resolve(flag: str, given: Path | None, variable: str, soname: str) -> Path | None:
    if given is not None:
        if not given.is_file():
            fail(f"{flag} {given}: no such file")
        return given
    found = default_library(variable, soname)
    if found is None or not found.is_file():
        print(
            f"note: no {soname} found ({variable} unset, not in ldconfig's cache); "
            f"pass {flag} LIB to check one",
            file=sys.stderr,
        )
        return None
    return found


def _hooks(limiter: Path) -> set[str]:
    """The wrappers: every function the limiter exports but its own dlsym and vgpu_* API."""
    return {
        name
        for name in exported_functions(limiter)
        if name != "dlsym" and not name.startswith("vgpu_")
    }


def _print(report: LibraryReport) -> None:
    handled = sum(len(e.handled) for e in report.entry_points)
    print(
        f"{report.api}: {report.library}: {report.exported} entry points "
        f"({len(report.entry_points)} base names), {handled} intercepted"
    )
    for family in FAMILIES:
        for entry in (e for e in report.entry_points if e.family == family):
            mark = "ok " if not entry.unhandled else "GAP"
            line = f"  {mark} {family:<11} {entry.base:<34} {', '.join(entry.handled) or '-'}"
            if entry.unhandled:
                line += f"  not intercepted: {', '.join(entry.unhandled)}"
            print(line)


def coverage(
    cuda: Annotated[
        Path | None,
        typer.Option(
            "--cuda",
            metavar="LIB",
            dir_okay=False,
            help="The driver (default: TF_CUDA_LIB_PATH, else libcuda.so.1 from ldconfig).",
        ),
    ] = None,
    nvml: Annotated[
        Path | None,
        typer.Option(
            "--nvml",
            metavar="LIB",
            dir_okay=False,
            help="NVML (default: TF_NVML_LIB_PATH, else libnvidia-ml.so.1 from ldconfig).",
        ),
    ] = None,
    limiter: Annotated[
        Path | None,
        typer.Option(
            "--limiter",
            metavar="LIB",
            dir_okay=False,
            help="The limiter to check (default: the installed libcuda_limiter.so).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """List every entry point the driver and NVML export (grouped by the base name
    cuGetProcAddress takes) against what the limiter intercepts; exit 1 when one of the
    allocation, free, launch, graph, memory-info or context families has a variant it misses."""
    try:
        limiter_file = _resolve("--limiter", limiter, "", "") if limiter else library_path()
    except FileNotFoundError as error:
        fail(str(error))
    assert limiter_file is not None
    libraries = [
        ("cuda", _resolve("--cuda", cuda, "TF_CUDA_LIB_PATH", "libcuda.so.1")),
        ("nvml", _resolve("--nvml", nvml, "TF_NVML_LIB_PATH", "libnvidia-ml.so.1")),
    ]
    if all(path is None for _, path in libraries):
        fail("no driver library to check: pass --cuda LIB and/or --nvml LIB")
    try:
        hooks = _hooks(limiter_file)
        reports = [compare(api, path, hooks) for api, path in libraries if path is not None]
    except ElfError as error:
        fail(str(error))
    gaps = [symbol for report in reports for e in report.gaps for symbol in e.unhandled]
    if as_json:
        document = {
            "limiter": str(limiter_file),
            **{report.api: report.to_json() for report in reports},
            "families": list(FAMILIES),
            "gaps": gaps,
        }
        print(json.dumps(document, indent=2))
    else:
        for report in reports:
            _print(report)
        if gaps:
            print(
                f"{len(gaps)} entry points of limit-carrying families are not intercepted: "
                f"{', '.join(gaps)}"
            )
        else:
            print("every entry point of the limit-carrying families is intercepted")
    if gaps:
        raise SystemExit(GAPS_FOUND)
