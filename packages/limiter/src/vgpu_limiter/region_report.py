"""A pod region's limits and usage as a report: plain data (JSON-ready) and its tables.

Used by `tf-limiter inspect` and `tf-hypervisor shm show`; the region module is imported only
when a report is made, so importing this one needs no built library.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vgpu_common.limits import format_bytes, format_percent, hundredths_to_percent
from vgpu_common.visible import visible

if TYPE_CHECKING:
    from vgpu_limiter.region import DeviceInfo, ProcessInfo, Region


def resolve_path(
    pod: str | None, path: Path | None, base: Path | None, environ: Mapping[str, str]
) -> Path:
    """The region file named by the arguments, else by the environment as the limiter reads
    it (its own configuration parser: the variables and rules it enforces, its errors)."""
    from vgpu_limiter.config import load_config
    from vgpu_limiter.region import DEFAULT_NAMESPACE, region_path

    if path is not None:
        if pod is not None:
            raise ValueError("give a POD or --path, not both")
        return path
    if pod is not None:
        namespace, _, name = pod.rpartition("/") if "/" in pod else (DEFAULT_NAMESPACE, "", pod)
        return region_path(base if base is not None else _base(environ), namespace, name)
    identity = load_config().pod  # ConfigError, a ValueError: the limiter's one line
    if identity.region_file is None:
        raise ValueError("name a POD (namespace/name) or --path FILE; this environment names none")
    if base is not None and identity.name is not None and identity.name_source is not None:
        return region_path(base, identity.namespace or DEFAULT_NAMESPACE, identity.name)
    return identity.region_file


def _base(environ: Mapping[str, str]) -> Path:
    """SHM_BASE_PATH, as the limiter takes it (absolute), else its default. A base given on
    the command line may be relative: it is the user's own path."""
    from vgpu_common.paths import DEFAULT_BASE

    value = environ.get("SHM_BASE_PATH")
    if not value:
        return DEFAULT_BASE
    if not value.startswith("/"):
        raise ValueError(f"SHM_BASE_PATH={value}: must be an absolute path")
    return Path(value)


# The report: plain data, printed as JSON or as tables.


def region_report(region: Region) -> dict[str, Any]:
    """Everything inspect shows, as JSON-ready data."""
    from vgpu_limiter.region import FLAG_FROZEN

    devices = region.devices
    return {
        "path": str(region.path),
        "namespace": region.namespace,
        "pod": region.pod,
        "version": region.version,
        "created_ns": region.created_ns,
        "flags": region.flags,
        "frozen": bool(region.flags & FLAG_FROZEN),
        "freeze_epoch": region.freeze_epoch,
        "devices": [_device_report(device) for device in devices],
        "processes": [_process_report(process) for process in region.processes],
    }


def _device_report(device: DeviceInfo) -> dict[str, Any]:
    return {
        "index": device.index,
        "uuid": device.uuid,
        "memory_limit": device.memory_limit,
        "memory_used": device.memory_used,
        "compute_limit": device.compute_limit,
        "compute_percent": device.compute_percent,
        "compute_soft_limit": device.compute_soft_limit,
        "oversubscribe": device.oversubscribe,
        "host_memory_used": device.host_memory_used,
        "gpu_seconds": device.gpu_ns / 1e9,
        "throttled_seconds": device.throttled_ns / 1e9,
        "burst_seconds": device.burst_ns / 1e9,
        "generation": device.generation,
        "refusals": device.refusals,
        "refused_bytes_last": device.refused_bytes_last,
    }


def _process_report(process: ProcessInfo) -> dict[str, Any]:
    return {
        "slot": process.slot,
        "pid": process.pid,
        "host_pid": process.host_pid,
        "pid_namespace": process.pid_namespace,
        "start_time": process.start_time,
        "heartbeat_ns": process.heartbeat_ns,
        "memory": process.memory,
    }


# Tables


def _format_time(ns: int) -> str:
    return "-" if ns == 0 else datetime.fromtimestamp(ns / 1e9).isoformat(" ", "seconds")


def _format_age(ns: int, now_ns: int) -> str:
    return "never" if ns == 0 else f"{max(now_ns - ns, 0) / 1e9:.1f}s ago"


def _boot_time() -> float | None:
    """Seconds since the epoch when the node booted (/proc/stat btime)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _format_start(ticks: int, boot: float | None) -> str:
    if ticks == 0 or boot is None:
        return str(ticks)
    return _format_time(int((boot + ticks / os.sysconf("SC_CLK_TCK")) * 1e9))


def _device_row(device: Mapping[str, Any]) -> list[str]:
    """Cells of one device; text from the file is never read as rich markup."""
    limit, used = device["memory_limit"], device["memory_used"]
    percent = device["compute_percent"]
    host = device["host_memory_used"]
    soft = device["compute_soft_limit"]
    compute = "none" if percent is None else format_percent(percent, "%")
    if soft:
        compute += f" (burst {format_percent(hundredths_to_percent(soft), '%')})"
    return [
        str(device["index"]),
        device["uuid"],
        format_bytes(used)
        + (f" + {format_bytes(host)} host" if host else "")
        + (" (oversubscribe)" if device["oversubscribe"] and not host else ""),
        "none" if limit == 0 else format_bytes(limit),
        "-" if limit == 0 else f"{100 * used / limit:.0f}%",
        compute,
        str(device["generation"]),
    ]


def _process_row(
    process: Mapping[str, Any], uuids: list[str], boot: float | None, now_ns: int
) -> list[str]:
    return [
        str(process["slot"]),
        str(process["pid"]),
        str(process["host_pid"] or "-"),
        str(process["pid_namespace"]),
        _format_start(process["start_time"], boot),
        _format_age(process["heartbeat_ns"], now_ns),
        *(format_bytes(process["memory"].get(uuid, 0)) for uuid in uuids),
    ]


def print_tables(report: Mapping[str, Any]) -> None:
    """The report as tables. The region's words (namespace, pod, GPU UUIDs) are its tenant's
    to write: every text shown is plain Text (never markup) with its control characters as
    escapes, so no escape sequence reaches the terminal and no newline forges a row."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def shown(cell: str) -> Text:
        return Text(visible(cell))

    console = Console()
    console.print(
        Text.assemble(
            "Pod ",
            (visible(f"{report['namespace']}/{report['pod']}"), "bold"),
            (" frozen" if report["frozen"] else "", "bold red"),
            visible(
                f"  {report['path']}  (region version {report['version']}, "
                f"created {_format_time(report['created_ns'])})"
            ),
        )
    )
    devices = Table(title="Devices", title_justify="left")
    for header in ("#", "UUID", "Used", "Limit", "Use", "Compute", "Gen"):
        if header == "UUID":  # folded, never cut, on a narrow terminal
            devices.add_column(header, overflow="fold")
        else:
            devices.add_column(header, justify="right")
    for device in report["devices"]:
        devices.add_row(*map(shown, _device_row(device)))
    console.print(devices)
    uuids = [device["uuid"] for device in report["devices"]]
    processes = Table(title="Processes", title_justify="left")
    for header in ("Slot", "PID", "Host PID", "PID namespace", "Started", "Heartbeat"):
        processes.add_column(header, justify="right")
    for device in report["devices"]:
        processes.add_column(f"GPU {device['index']}", justify="right")
    boot, now_ns = _boot_time(), time.time_ns()
    for process in report["processes"]:
        processes.add_row(*map(shown, _process_row(process, uuids, boot, now_ns)))
    if not report["processes"]:
        processes.caption = "no process holds a slot"
    console.print(processes)
