"""tf-limiter check-config: validate the limiter's environment and show what it would enforce.

The answer comes from libcuda_limiter.so itself, so it is what a CUDA program started with this
environment would get: the same limits, or the same one-line error (and failed CUDA calls).
"""

import json
import os
import sys
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from vgpu_common.cli import fail
from vgpu_common.limits import WHOLE_GPU, format_percent, format_size, hundredths_to_percent

from vgpu_limiter.config import describe_json

JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print the library's JSON document instead of a table (still exit 2 when invalid).",
    ),
]


def _device_name(device: dict[str, Any]) -> str:
    if device["kind"] == "all":
        return "all devices"
    if device["kind"] == "index":
        return f"index {device['index']}"
    return str(device["uuid"])


def _percent(hundredths: int) -> str:
    """A compute limit of the table; the whole GPU is marked as no limit, as the library
    reads it."""
    return format_percent(hundredths_to_percent(hundredths)) + (
        " (no limit)" if hundredths == WHOLE_GPU else ""
    )


def _sort_key(device: dict[str, Any]) -> tuple[int, int, str]:
    order = {"all": 0, "index": 1, "uuid": 2}
    return order[device["kind"]], device["index"] or 0, device["uuid"] or ""


def _console() -> Console:
    # Off a terminal (a pipe, a log) rich would assume 80 columns and squeeze the table.
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)
    return console


def _print_table(document: dict[str, Any]) -> None:
    console = _console()
    devices = sorted(document["devices"], key=_sort_key)
    if devices:
        # One row per limit: narrow enough for a terminal, a UUID and a variable name per row.
        table = Table(box=box.SIMPLE_HEAD, title="Limits per device", title_justify="left")
        table.add_column("Device", overflow="fold")
        table.add_column("Limit", no_wrap=True)
        table.add_column("Value", justify="right", no_wrap=True)
        table.add_column("Bytes", justify="right", no_wrap=True)
        table.add_column("From", overflow="fold")
        for device in devices:
            name = _device_name(device)
            memory = device["memory_limit"]
            compute = device["compute_limit"]
            if memory is not None:
                table.add_row(
                    name, "memory", format_size(memory), str(memory), device["memory_source"]
                )
                name = ""
            if compute is not None:
                table.add_row(name, "compute", _percent(compute), "", device["compute_source"])
                name = ""
            soft = device.get("soft_limit")
            if soft is not None:
                table.add_row(name, "soft compute", _percent(soft), "", device["soft_source"])
                name = ""
            oversubscribe = device.get("oversubscribe")
            if oversubscribe is not None:
                table.add_row(
                    name,
                    "oversubscribe",
                    "on" if oversubscribe else "off",
                    "",
                    device["oversubscribe_source"],
                )
        console.print(table)
        console.print(
            "Index keys are CUDA ordinals as the program sees them; UUID keys bind the physical "
            "GPU. For each limit a UUID key wins over an index key, which wins over all devices.",
            markup=False,
        )
    else:
        console.print("Limits: none; every device is passed through untouched.")
    _print_settings(console, document)
    for warning in document["warnings"]:
        console.print(f"Warning: {warning}", markup=False, soft_wrap=True)


def _print_settings(console: Console, document: dict[str, Any]) -> None:
    """Every other setting, with the variable it came from."""
    pod = document["pod"]
    process = document["process"]
    log = document["log"]
    table = Table(box=box.SIMPLE_HEAD, title="Settings", title_justify="left")
    table.add_column("Setting", no_wrap=True)
    table.add_column("Value", overflow="fold")
    table.add_column("From", overflow="fold")
    if pod["source"] == "private":
        table.add_row("pod", "none: a private region for each process tree", "")
    else:
        table.add_row("pod folder", pod["folder"], pod["source"])
        table.add_row("region file", pod["region_file"], pod["source"])
    if pod["name"] is not None:
        prefix = "VGPU_" if pod["name_source"] == "VGPU_POD_NAME" else ""
        table.add_row(
            "pod", f"{pod['namespace']}/{pod['name']}", f"{prefix}POD_NAMESPACE, {prefix}POD_NAME"
        )
    if pod["uid"] is not None:
        table.add_row("pod UID", pod["uid"], "VGPU_POD_UID")
    if pod["container"] is not None:
        table.add_row("container", pod["container"], pod["container_source"])
    table.add_row("base folder", pod["base"], pod["base_source"])
    if pod["region_required"]:
        made = "required: the node daemon's, never made here"
        table.add_row("region", made, "TF_REGION_REQUIRED")
    table.add_row(
        "context overhead",
        format_size(process["context_overhead"]),
        process["context_overhead_source"],
    )
    table.add_row("CUDA driver", process["cuda_library"], process["cuda_library_source"])
    table.add_row("NVML", process["nvml_library"], process["nvml_library_source"])
    table.add_row("temporary folder", process["tmp_folder"], process["tmp_source"])
    table.add_row("log level", log["level"], log["level_source"])
    table.add_row(
        "log",
        log["path"] if log["path"] is not None else "stderr",
        "TF_LOG_PATH" if log["path"] is not None else "default",
    )
    console.print(table)


def check_config(json_output: JsonOption = False) -> None:
    """Check the limiter's environment variables and show what would be enforced.

    Reads every variable the library reads (docs/configuration.md) and shows each setting with
    the variable it came from, and the warnings the library would log: variables of other
    systems it does not support, index keys for devices the process does not see, a pod the
    daemon does not manage. An invalid or contradictory value: one line on stderr and exit 2.
    """
    try:
        text = describe_json()
    except OSError as error:
        fail(f"cannot load the limiter library: {error}")
    document = json.loads(text)
    if json_output:
        # Bytes as the library wrote them (a path need not be UTF-8).
        sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape") + b"\n")
        sys.stdout.flush()
    if not document["ok"]:
        fail(document["error"])
    if not json_output:
        _print_table(document)


if __name__ == "__main__":
    typer.run(check_config)
