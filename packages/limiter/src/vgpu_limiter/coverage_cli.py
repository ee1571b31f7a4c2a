"""tf-limiter coverage: the driver's entry points against what libcuda_limiter.so intercepts."""

from pathlib import Path
from typing import Annotated

import typer

from vgpu_limiter.coverage_report import run


def coverage(
    cuda: Annotated[
        Path | None,
        typer.Option(
            "--cuda",
            metavar="LIB",
            help="The driver (default: TF_CUDA_LIB_PATH, else libcuda.so.1 from ldconfig).",
        ),
    ] = None,
    nvml: Annotated[
        Path | None,
        typer.Option(
            "--nvml",
            metavar="LIB",
            help="NVML (default: TF_NVML_LIB_PATH, else libnvidia-ml.so.1 from ldconfig).",
        ),
    ] = None,
    limiter: Annotated[
        Path | None,
        typer.Option(
            "--limiter",
            metavar="LIB",
            help="The limiter to check (default: the installed libcuda_limiter.so).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """List every entry point the driver and NVML export (grouped by the base name
    cuGetProcAddress takes) against what the limiter intercepts; exit 1 when one of the
    allocation, free, launch, graph, memory-info or context families has a variant it misses."""
    code = run(cuda, nvml, limiter, as_json)
    if code:
        raise SystemExit(code)
