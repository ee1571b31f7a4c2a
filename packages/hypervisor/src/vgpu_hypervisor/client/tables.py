"""Tables of the API's documents for the terminal (the CLI listings). At a terminal's width the
columns of least use drop first and a command is shortened, so that each row stays on one line
and no name or number is cut; `-o wide` (width None) shows every column in full."""

import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from vgpu_common.limits import format_bytes, format_percent
from vgpu_common.visible import visible

from vgpu_hypervisor.client.command_line import short_command
from vgpu_hypervisor.client.fit import Column, fitted

NA = "N/A"


def size(value: int | None) -> str:
    return NA if value is None else format_bytes(value)


def percent(value: float | None) -> str:
    """A percent in a table cell, N/A where there is none."""
    return NA if value is None else format_percent(value, "%")


_GPU_COLUMNS = (
    Column("GPU"),
    Column("Name", drop=4),
    Column("Memory"),
    Column("Util", right=True),
    Column("Temp", drop=3, right=True),
    Column("Power", drop=2, right=True),
    Column("Boost", drop=5, right=True),
    Column("Pods", drop=1, right=True),
    Column("Workers", drop=1, right=True),
)
_GPU_WIDE = (Column("UUID"), Column("Mem util", right=True), Column("SM clock", right=True))


def _committed(gpu: dict[str, Any]) -> str:
    """What the device plugin charged pods on the GPU: memory and compute."""
    memory, compute = gpu.get("memory_committed"), gpu.get("compute_committed")
    return f"{size(memory)}, {percent(compute)}"


_COMMITTED = Column("Committed", drop=2)


def gpu_table(gpus: list[dict[str, Any]], *, width: int | None = 80, wide: bool = False) -> Table:
    """``width``: the terminal's; ``wide`` adds the UUID, memory utilization and clock. With
    the device plugin, a Committed column says what it charged pods on each GPU."""
    accounted = any(gpu.get("memory_committed") is not None for gpu in gpus)
    columns = _GPU_COLUMNS[:3] + (_COMMITTED,) * accounted + _GPU_COLUMNS[3:]
    rows = []
    for gpu in gpus:
        used, total = gpu.get("memory_used"), gpu.get("memory_total")
        clock = gpu.get("sm_clock_mhz")
        rows.append(
            [
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
                gpu.get("uuid") or NA,
                percent(gpu.get("memory_utilization")),
                NA if clock is None else f"{clock} MHz",
            ]
        )
    return _table(columns, _GPU_WIDE, rows, width, wide=wide)


def _table(
    columns: tuple[Column, ...],
    wide_columns: tuple[Column, ...],
    rows: Sequence[Sequence[str]],
    width: int | None,
    *,
    wide: bool,
    styles: Sequence[str | None] = (),
) -> Table:
    if wide:
        return fitted(columns + wide_columns, rows, None, styles)
    return fitted(columns, [row[: len(columns)] for row in rows], width, styles)


_POD_COLUMNS = (
    Column("Pod"),
    Column("GPU", drop=1),
    Column("Memory used / limit"),
    Column("Compute", drop=2, right=True),
    Column("Util", drop=3, right=True),
    Column("Burst", drop=5, right=True),
    Column("Workers", drop=6, right=True),
    Column("Host memory", drop=4),
)
_POD_WIDE = (
    Column("QoS"),
    Column("GPU UUID"),
    Column("Created"),
    Column("Region"),
    Column("Error"),
)


def pod_table(pods: list[dict[str, Any]], *, width: int | None = 80, wide: bool = False) -> Table:
    """A row per pod and GPU; ``wide`` adds class and weight, UUID, creation and region."""
    rows: list[list[str]] = []
    styles: list[str | None] = []
    for pod in pods:
        name = f"{pod['namespace']}/{pod['name']}"
        if pod.get("phase"):  # a Kubernetes pod
            name += f" ({pod['phase']})"
        if pod.get("frozen"):
            name += " (frozen)"
        qos = f"{pod.get('qos', 'medium')} ({pod.get('weight', 2)})"
        path = pod.get("path") or NA
        if pod.get("error"):
            rows.append([name, "", "error (below)", "", "", "", str(pod["workers"]), ""])
            rows[-1] += [qos, "", _created(pod), path, pod["error"]]
            styles.append("red")
            continue
        for number, gpu in enumerate(pod["gpus"] or [None]):
            first = number == 0
            if gpu is None:
                rows.append([name, "-", "", "", "", "", str(pod["workers"]), ""])
                rows[-1] += [qos, "", _created(pod), path, ""]
                styles.append(None)
                continue
            limit = gpu.get("memory_limit")
            gpu_name = str(gpu["index"]) if gpu.get("index") is not None else gpu["uuid"]
            compute, burst = gpu.get("compute_limit"), gpu.get("compute_burst")
            rows.append(
                [
                    name if first else "",
                    gpu_name,
                    f"{size(gpu['memory_used'])} / {size(limit) if limit else 'none'}",
                    percent(compute) if compute else "none",
                    percent(gpu.get("utilization")),
                    percent(burst) if burst else "-",
                    str(pod["workers"]) if first else "",
                    _host_backed(gpu),
                    qos if first else "",
                    gpu["uuid"],
                    _created(pod) if first else "",
                    path if first else "",
                    "",
                ]
            )
            styles.append(None)
    return _table(_POD_COLUMNS, _POD_WIDE, rows, width, wide=wide, styles=styles)


def pod_errors(pods: list[dict[str, Any]]) -> list[str]:
    """The pods' errors in full, one a line, for under the table (the Error column of wide)."""
    # Printed below the table, not in it: escaped here as fitted() escapes cells.
    return [visible(f"{p['namespace']}/{p['name']}: {p['error']}") for p in pods if p.get("error")]


def _host_backed(gpu: dict[str, Any]) -> str:
    """What an oversubscribed pod keeps in host memory ("-": it does not oversubscribe)."""
    if not gpu.get("oversubscribe") and not gpu.get("host_memory_used"):
        return "-"
    return size(gpu.get("host_memory_used") or 0)


def _created(pod: dict[str, Any]) -> str:
    created = pod.get("created")
    return NA if created is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))


def gpu_indexes(gpus: list[dict[str, Any]]) -> dict[str, int]:
    """The node's index of each GPU, by lower-case UUID (worker documents name UUIDs)."""
    return {str(g["uuid"]).lower(): g["index"] for g in gpus if g.get("uuid")}


def worker_gpus(worker: dict[str, Any], indexes: dict[str, int]) -> str:
    """The GPUs a worker holds memory on, by index where the node knows it ("0,1")."""
    holding = [g for g in worker.get("gpus", []) if g["memory_used"] or g.get("host_memory_used")]
    named = [str(indexes.get(str(g["uuid"]).lower(), g["uuid"])) for g in holding]
    return ",".join(named) or "-"


def _command(worker: dict[str, Any]) -> tuple[str, str]:
    """The command line, escaped (fitted() escapes every cell, and the Command column finds
    each cell's parts by the text shown), and its note: exited, or not limited."""
    notes = []
    if not worker.get("alive", True):
        notes.append("(exited)")
    if not worker.get("limited", True):
        notes.append("(no limiter: unlimited)")
    return visible(worker.get("command") or NA), " ".join(notes)


def worker_table(
    workers: list[dict[str, Any]],
    *,
    width: int | None = 80,
    wide: bool = False,
    indexes: dict[str, int] | None = None,
) -> Table:
    """``indexes``: GPU index by UUID (gpu_indexes), to name a worker's GPUs by index."""
    parts: dict[str, tuple[str, str]] = {}  # a row's Command cell: its command and note

    def shortened(cell: str, room: int) -> str:
        return short_command(*parts.get(cell, (cell, "")), width=room)

    columns = (
        Column("Pod"),
        Column("PID", right=True),
        Column("Host PID", drop=6, right=True),
        Column("GPU", drop=2),
        Column("GPU memory"),
        Column("Util", drop=4, right=True),
        Column("Up", drop=5, right=True),
        Column("Command", drop=3, flexible=True, least=16, shorten=shortened),
    )
    now = time.time()
    rows = []
    for worker in workers:
        gpus = worker.get("gpus", [])
        memory = ", ".join(size(g["memory_used"]) for g in gpus if g["memory_used"]) or "0 B"
        utils = [g["utilization"] for g in gpus if g.get("utilization") is not None]
        started = worker.get("started")
        container = worker.get("container")
        last = worker.get("last_gpu_call")
        command, note = _command(worker)
        shown = f"{command} {note}".rstrip()
        parts[shown] = (command, note)
        rows.append(
            [
                f"{worker['namespace']}/{worker['pod']}" + (f" ({container})" if container else ""),
                str(worker["pid"]),
                NA if worker.get("host_pid") is None else str(worker["host_pid"]),
                worker_gpus(worker, indexes or {}),
                memory,
                percent(sum(utils)) if utils else NA,
                NA if started is None else duration(now - started),
                shown,
                str(worker.get("slot", NA)),
                NA if last is None else f"{duration(now - last)} ago",
            ]
        )
    wide_columns = (Column("Slot", right=True), Column("Last GPU call", right=True))
    return _table(columns, wide_columns, rows, width, wide=wide)


def duration(seconds: float) -> str:
    """A short age: "45s", "12m", "3h07m"."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
