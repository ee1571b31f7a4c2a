"""Tables of the API's documents for the terminal (the CLI listings and `top`)."""

import time
from typing import Any

from rich import box
from rich.bar import Bar
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from vgpu_common.units import format_bytes

NA = "N/A"


def size(value: int | None) -> str:
    return NA if value is None else format_bytes(value)


def percent(value: float | None) -> str:
    return NA if value is None else f"{value:g}%"


def bar(used: float | None, total: float | None, width: int = 20) -> RenderableType:
    """A usage bar; blank where a figure is missing."""
    if used is None or not total:
        return Text(" " * width)
    share = min(1.0, used / total)
    color = "green" if share < 0.7 else "yellow" if share < 0.9 else "red"
    return Bar(size=1.0, begin=0.0, end=share, width=width, color=color, bgcolor="grey23")


def _table(title: str | None, *columns: str) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", expand=False)
    for column in columns:
        table.add_column(column, no_wrap=column not in ("Command", "Error"), overflow="fold")
    return table


def gpu_table(gpus: list[dict[str, Any]], *, bars: bool = False) -> Table:
    columns = ["GPU", "Name", "Memory", "Util", "Temp", "Power", "Boost", "Pods", "Workers"]
    if bars:
        columns[3:3] = ["", ""]
    table = _table("GPUs" if bars else None, *columns)
    for gpu in gpus:
        used, total = gpu.get("memory_used"), gpu.get("memory_total")
        row: list[RenderableType] = [
            str(gpu["index"]),
            gpu.get("name") or NA,
            f"{size(used)} / {size(total)}",
            percent(gpu.get("utilization")),
            NA if gpu.get("temperature_c") is None else f"{gpu['temperature_c']} °C",
            NA if gpu.get("power_draw_w") is None else f"{gpu['power_draw_w']:.0f} W",
            NA if gpu.get("boost") is None else f"{gpu['boost']:.2f}",
            str(gpu.get("pods", 0)),
            str(gpu.get("workers", 0)),
        ]
        if bars:
            row[3:3] = [bar(used, total), bar(gpu.get("utilization"), 100, 10)]
        table.add_row(*row)
    return table


def _compute(gpu: dict[str, Any]) -> str:
    if not gpu.get("compute_limit"):
        return "no limit"
    burst = gpu.get("compute_burst")
    return percent(gpu["compute_limit"]) + (f" (burst {percent(burst)})" if burst else "")


def pod_table(pods: list[dict[str, Any]], *, bars: bool = False) -> Table:
    columns = ["Pod", "GPU", "Memory used / limit", "Compute limit", "Util", "Workers", "Error"]
    if bars:
        columns.insert(3, "")
    table = _table("Pods" if bars else None, *columns)
    for pod in pods:
        name = f"{pod['namespace']}/{pod['name']}" + (" (frozen)" if pod.get("frozen") else "")
        if pod.get("error"):
            row: list[RenderableType] = [name, "", "", "", "", str(pod["workers"]), pod["error"]]
            if bars:
                row.insert(3, "")
            table.add_row(*row, style="red")
            continue
        for number, gpu in enumerate(pod["gpus"] or [None]):
            if gpu is None:
                row = [name, "-", "", "", "", str(pod["workers"]), ""]
                if bars:
                    row.insert(3, "")
                table.add_row(*row)
                continue
            limit = gpu.get("memory_limit")
            gpu_name = str(gpu["index"]) if gpu.get("index") is not None else gpu["uuid"]
            row = [
                name if number == 0 else "",
                gpu_name,
                f"{size(gpu['memory_used'])} / {size(limit) if limit else 'no limit'}",
                _compute(gpu),
                percent(gpu.get("utilization")),
                str(pod["workers"]) if number == 0 else "",
                "",
            ]
            if bars:
                row.insert(3, bar(gpu["memory_used"], limit))
            table.add_row(*row)
    return table


def worker_table(workers: list[dict[str, Any]]) -> Table:
    table = _table(None, "Pod", "PID", "Host PID", "GPU memory", "Util", "Up", "Command")
    now = time.time()
    for worker in workers:
        gpus = worker.get("gpus", [])
        memory = ", ".join(size(g["memory_used"]) for g in gpus if g["memory_used"]) or "0 B"
        utils = [g["utilization"] for g in gpus if g.get("utilization") is not None]
        started = worker.get("started")
        table.add_row(
            f"{worker['namespace']}/{worker['pod']}",
            str(worker["pid"]),
            NA if worker.get("host_pid") is None else str(worker["host_pid"]),
            memory,
            percent(sum(utils)) if utils else NA,
            NA if started is None else _duration(now - started),
            (worker.get("command") or NA) + ("" if worker.get("alive", True) else " (exited)"),
        )
    return table


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def top_view(status: dict[str, Any], gpus: Any, pods: Any, workers: Any) -> RenderableType:
    header = Text.assemble(
        ("tf-hypervisor ", "bold"),
        f"{status.get('version', '')}  ",
        (status.get("backend_description", ""), "dim"),
        "\n",
        f"{status.get('pods', 0)} pod(s), {status.get('workers', 0)} worker(s)  ",
        ("q or Ctrl-C quits", "dim"),
    )
    return Group(
        header, gpu_table(gpus, bars=True), pod_table(pods, bars=True), worker_table(workers)
    )
