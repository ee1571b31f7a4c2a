"""The coverage report itself, standard library only, so that it also runs on a GPU node where
nothing of vgpu is installed:

    PYTHONPATH=packages/limiter/src:packages/common/src \\
        python3 -m vgpu_limiter.coverage_report --cuda LIB --limiter libcuda_limiter.so

``tf-limiter coverage`` is the same report with the same options.
"""

import argparse
import json
import sys
from pathlib import Path

from vgpu_common.cli import fail

from vgpu_limiter import library_path
from vgpu_limiter.coverage import FAMILIES, LibraryReport, compare, default_library
from vgpu_limiter.elf_symbols import ElfError, exported_functions

# Exit status when a limit-carrying entry point is not intercepted (2 stays for bad input).
GAPS_FOUND = 1


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


def run(cuda: Path | None, nvml: Path | None, limiter: Path | None, as_json: bool) -> int:
    """Print the report; 0 without gaps, GAPS_FOUND with. Bad input exits 2 with one line."""
    if limiter is None:
        try:
            limiter = library_path()
        except FileNotFoundError as error:
            fail(f"{error} (pass --limiter LIB)")
    elif not limiter.is_file():
        fail(f"--limiter {limiter}: no such file")
    libraries = [
        ("cuda", _resolve("--cuda", cuda, "TF_CUDA_LIB_PATH", "libcuda.so.1")),
        ("nvml", _resolve("--nvml", nvml, "TF_NVML_LIB_PATH", "libnvidia-ml.so.1")),
    ]
    if all(path is None for _, path in libraries):
        fail("no driver library to check: pass --cuda LIB and/or --nvml LIB")
    try:
        hooks = _hooks(limiter)
        reports = [compare(api, path, hooks) for api, path in libraries if path is not None]
    except ElfError as error:
        fail(str(error))
    gaps = [symbol for report in reports for e in report.gaps for symbol in e.unhandled]
    if as_json:
        document = {
            "limiter": str(limiter),
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
    return GAPS_FOUND if gaps else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m vgpu_limiter.coverage_report",
        description="The driver's entry points against what libcuda_limiter.so intercepts.",
    )
    parser.add_argument("--cuda", type=Path, metavar="LIB")
    parser.add_argument("--nvml", type=Path, metavar="LIB")
    parser.add_argument("--limiter", type=Path, metavar="LIB")
    parser.add_argument("--json", action="store_true", dest="as_json")
    options = parser.parse_args(argv)
    return run(options.cuda, options.nvml, options.limiter, options.as_json)


if __name__ == "__main__":
    raise SystemExit(main())
