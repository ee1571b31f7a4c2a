"""Tables of the API's documents for the terminal (the CLI listings; `-o wide` adds columns)."""

import time
from typing import Any

from rich import box
from rich.console import RenderableType
from rich.table import Table
from vgpu_common.limits import format_bytes, format_percent

NA = "N/A"


def size(value: int | None) -> str:
    return NA if value is None else format_bytes(value)


def percent(value: float | None) -> str:
    """A percent in a table cell, N/A where there is none."""
    return NA if value is None else format_percent(value, "%")


def _table(title: str | None, *columns: str) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", expand=False)
    for column in columns:
        table.add_column(column, no_wrap=column not in ("Command", "Error"), overflow="fold")
    return table


def _committed(gpu: dict[str, Any]) -> str:
    """What the device plugin charged pods on the GPU: memory and compute."""
    memory, compute = gpu.get("memory_committed"), gpu.get("compute_committed")
    return f"{size(memory)}, {percent(compute)}"


def gpu_table(gpus: list[dict[str, Any]], *, wide: bool = False) -> Table:
    """With the device plugin, a Committed column says what it charged pods on each GPU."""
    accounted = any(gpu.get("memory_committed") is not None for gpu in gpus)
    columns = ["GPU", "Name", "Memory", *["Committed"] * accounted, "Util", "Temp", "Power",
               "Boost", "Pods", "Workers"]  # fmt: skip
    if wide:
        columns += ["UUID", "Mem util", "SM clock"]
    table = _table(None, *columns)
    for gpu in gpus:
        used, total = gpu.get("memory_used"), gpu.get("memory_total")
        row: list[RenderableType] = [
            str(gpu["index"]),
            gpu.get("name") or NA,
            f"{size(used)} / {size(total)}",
            *[_committed(gpu)] * accounted,
            percent(gpu.get("utilization")),
            NA if gpu.get("temperature_c") is None else f"{gpu['temperature_c']} °C",
            NA if gpu.get("power_draw_w") is None else f"{gpu['power_draw_w']:.0f} W",
            NA if gpu.get("boost") is None else f"{gpu['boost']:.2f}",
            str(gpu.get("pods", 0)),
            str(gpu.get("workers", 0)),
        ]
        if wide:
            clock = gpu.get("sm_clock_mhz")
            row += [
                gpu.get("uuid") or NA,
                percent(gpu.get("memory_utilization")),
                NA if clock is None else f"{clock} MHz",
            ]
        table.add_row(*row)
    return table


def _compute(gpu: dict[str, Any]) -> str:
    if not gpu.get("compute_limit"):
        return "no limit"
    burst = gpu.get("compute_burst")
    return percent(gpu["compute_limit"]) + (f" (burst {percent(burst)})" if burst else "")


def pod_table(pods: list[dict[str, Any]], *, wide: bool = False) -> Table:
    columns = ["Pod", "GPU", "Memory used / limit", "Compute limit", "Util", "Workers", "Error"]
    if wide:
        columns += ["GPU UUID", "Created", "Region"]
    table = _table(None, *columns)
    for pod in pods:
        name = f"{pod['namespace']}/{pod['name']}"
        if pod.get("phase"):  # a Kubernetes pod
            name += f" ({pod['phase']})"
        if pod.get("frozen"):
            name += " (frozen)"
        if pod.get("error"):
            row: list[RenderableType] = [name, "", "", "", "", str(pod["workers"]), pod["error"]]
            if wide:
                row += ["", _created(pod), pod.get("path") or NA]
            table.add_row(*row, style="red")
            continue
        for number, gpu in enumerate(pod["gpus"] or [None]):
            if gpu is None:
                row = [name, "-", "", "", "", str(pod["workers"]), ""]
                if wide:
                    row += ["", _created(pod), pod.get("path") or NA]
                table.add_row(*row)
                continue
            limit = gpu.get("memory_limit")
            gpu_name = str(gpu["index"]) if gpu.get("index") is not None else gpu["uuid"]
            row = [
                name if number == 0 else "",
                gpu_name,
                f"{size(gpu['memory_used'])} / {size(limit) if limit else 'no limit'}"
                + _host_backed(gpu),
                _compute(gpu),
                percent(gpu.get("utilization")),
                str(pod["workers"]) if number == 0 else "",
                "",
            ]
            if wide:
                first = number == 0
                row += [gpu["uuid"], _created(pod) if first else "", pod["path"] if first else ""]
            table.add_row(*row)
    return table


def _host_backed(gpu: dict[str, Any]) -> str:
    """What an oversubscribed pod keeps in host memory, after its device memory."""
    host = gpu.get("host_memory_used") or 0
    if host:
        return f" + {size(host)} host"
    return " (oversubscribe)" if gpu.get("oversubscribe") else ""


def _created(pod: dict[str, Any]) -> str:
    created = pod.get("created")
    return NA if created is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))


def worker_table(workers: list[dict[str, Any]], *, wide: bool = False) -> Table:
    columns = ["Pod", "PID", "Host PID", "GPU memory", "Util", "Up", "Command"]
    if wide:
        columns[-1:-1] = ["Slot", "Last GPU call"]
    table = _table(None, *columns)
    now = time.time()
    for worker in workers:
        gpus = worker.get("gpus", [])
        memory = ", ".join(size(g["memory_used"]) for g in gpus if g["memory_used"]) or "0 B"
        utils = [g["utilization"] for g in gpus if g.get("utilization") is not None]
        started = worker.get("started")
        container = worker.get("container")
        row = [
            f"{worker['namespace']}/{worker['pod']}" + (f" ({container})" if container else ""),
            str(worker["pid"]),
            NA if worker.get("host_pid") is None else str(worker["host_pid"]),
            memory,
            percent(sum(utils)) if utils else NA,
            NA if started is None else _duration(now - started),
            (worker.get("command") or NA)
            + ("" if worker.get("alive", True) else " (exited)")
            + ("" if worker.get("limited", True) else " (no limiter: unlimited)"),
        ]
        if wide:
            last = worker.get("last_gpu_call")
            row[-1:-1] = [
                str(worker.get("slot", NA)),
                NA if last is None else f"{_duration(now - last)} ago",
            ]
        table.add_row(*row)
    return table


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
