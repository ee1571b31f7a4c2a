"""tf-limiter inspect: a pod region's limits and usage, per device and per process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from vgpu_common.cli import fail
from vgpu_common.paths import DEFAULT_BASE

from vgpu_limiter.region_report import print_tables, region_report, resolve_path


def inspect(
    pod: Annotated[
        str | None,
        typer.Argument(
            metavar="[POD]",
            help=(
                "namespace/name, or name in namespace 'default'. Default: the pod of this "
                "environment (SHM_PATH, else POD_NAMESPACE/POD_NAME)."
            ),
            show_default=False,
        ),
    ] = None,
    base: Annotated[
        Path | None,
        typer.Option(
            "--base",
            metavar="PATH",
            help=f"The folder of the pods' regions (default: SHM_BASE_PATH, else {DEFAULT_BASE}).",
            show_default=False,
        ),
    ] = None,
    path: Annotated[
        Path | None,
        typer.Option("--path", metavar="FILE", help="A region file to read instead of a pod's."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Show a pod region: limits and usage per GPU and per process."""
    try:
        from vgpu_limiter import region as regions
    except (ImportError, RuntimeError) as error:
        fail(str(error))
    try:
        file = resolve_path(pod, path, base, os.environ)
        with regions.open_region(file, writable=False) as region:
            report = region_report(region)
    except (ValueError, regions.RegionError) as error:
        fail(str(error))
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_tables(report)
