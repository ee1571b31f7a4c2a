"""The screen of `tf-hypervisor top`, laid out for the terminal's size.

Rows are fitted by hand rather than by rich tables so that the view never wraps or ends in a
cropped line: every column has a width, the one flexible column (GPU name, pod, command) takes
what is left, and sections that do not fit the height end in "+N more". Below 120 columns the
compact mode drops the bars, the GPU name, the boost and the host pid; the GPU index, memory,
Util, Temp and Power always stay.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text
from vgpu_common.limits import format_bytes, format_percent

FULL_WIDTH = 120  # from here on: bars, GPU names, boost, host pids
SORT_KEYS = ("name", "memory", "util")
NA = "-"


@dataclass
class ViewState:
    """What the keys change: sort key and order, the name filter, help, the mode."""

    sort: str = "name"
    reverse: bool = False
    filter: str = ""
    editing_filter: bool = False
    show_help: bool = False
    mode: str = "auto"  # auto (by width), compact, full

    def compact(self, width: int) -> bool:
        return self.mode == "compact" or (self.mode == "auto" and width < FULL_WIDTH)


@dataclass
class Snapshot:
    """The daemon's documents of one refresh, or why there are none."""

    status: dict[str, Any] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    taken: float = 0.0


@dataclass(frozen=True)
class Column:
    title: str
    width: int  # 0: the flexible column
    right: bool = False
    most: int = 1000  # the flexible column's widest


def shorten(text: str, width: int) -> str:
    """``text`` in ``width`` cells; a long one keeps its start and end around one "~"."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = width // 2
    tail = width - 1 - head
    return text[:head] + "~" + (text[-tail:] if tail else "")


def _size(value: int | None) -> str:
    return NA if value is None else format_bytes(value).replace(" ", "")


def _percent(value: float | None) -> str:
    """A percent in a narrow column, NA where there is none."""
    return NA if value is None else format_percent(value, "%")


def _bar(share: float | None, width: int) -> Text:
    if share is None or width <= 0:
        return Text(" " * width)
    share = max(0.0, min(1.0, share))
    filled = round(share * width)
    color = "green" if share < 0.7 else "yellow" if share < 0.9 else "red"
    return Text("█" * filled, style=color) + Text("░" * (width - filled), style="grey35")


def _line(columns: Sequence[Column], cells: Sequence[str | Text], width: int) -> Text:
    """One row: fixed columns as given, the flexible one gets the rest; never wider than width."""
    fixed = sum(c.width for c in columns) + len(columns) - 1
    most = min((c.most for c in columns if not c.width), default=0)
    flex = max(4, min(most, width - fixed))
    line = Text()
    for number, (column, cell) in enumerate(zip(columns, cells, strict=True)):
        size = column.width or flex
        if number:
            line.append(" ")
        if isinstance(cell, Text):
            piece = cell.copy()
            piece.truncate(size, pad=True)
            line.append_text(piece)
        else:
            text = shorten(cell, size)
            line.append(text.rjust(size) if column.right else text.ljust(size))
    line.truncate(width)
    line.rstrip()
    return line


def _header(columns: Sequence[Column], width: int) -> Text:
    line = _line(columns, [c.title for c in columns], width)
    line.stylize("bold reverse")
    return line


# --- the sections ------------------------------------------------------------------------


def _gpu_lines(gpus: list[dict[str, Any]], width: int, compact: bool) -> list[Text]:
    columns = [Column("GPU", 3, right=True)]
    if not compact:
        columns.append(Column("Name", 0, most=32))
    columns += [Column("Memory used/total", 17, right=True)]
    bar = 0 if compact else 16
    if bar:
        columns.append(Column("", bar))
    columns += [Column("Util", 4, right=True)]
    if bar:
        columns.append(Column("", 10))
    columns += [Column("Temp", 5, right=True), Column("Power", 6, right=True)]
    if not compact:
        columns.append(Column("Boost", 5, right=True))
    columns += [Column("Pods", 4, right=True), Column("Wkrs", 4, right=True)]
    if compact:  # the flexible column: the GPU name, as much as fits
        columns.append(Column("Name", 0))
    lines = [_header(columns, width)]
    for gpu in gpus:
        used, total = gpu.get("memory_used"), gpu.get("memory_total")
        cells: dict[str, str | Text] = {
            "GPU": str(gpu["index"]),
            "Name": gpu.get("name") or NA,
            "Memory used/total": f"{_size(used)}/{_size(total)}",
            "Util": _percent(gpu.get("utilization")),
            "Temp": NA if gpu.get("temperature_c") is None else f"{gpu['temperature_c']}C",
            "Power": NA if gpu.get("power_draw_w") is None else f"{gpu['power_draw_w']:.0f}W",
            "Boost": NA if gpu.get("boost") is None else f"{gpu['boost']:.2f}",
            "Pods": str(gpu.get("pods", 0)),
            "Wkrs": str(gpu.get("workers", 0)),
        }
        row: list[str | Text] = []
        bars = iter(
            [
                _bar(used / total if used is not None and total else None, bar),
                _bar(None if gpu.get("utilization") is None else gpu["utilization"] / 100, 10),
            ]
        )
        for column in columns:
            row.append(next(bars) if column.title == "" else cells[column.title])
        lines.append(_line(columns, row, width))
    return lines


def _pod_rows(pods: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    return [(pod, gpu) for pod in pods for gpu in (pod.get("gpus") or [None])]


def _pod_lines(pods: list[dict[str, Any]], width: int, compact: bool) -> list[Text]:
    columns = [
        Column("Pod", 0, most=72),
        Column("GPU", 3, right=True),
        Column("Memory used/limit", 17, right=True),
        Column("Comp", 5, right=True),
        Column("Util", 4, right=True),
        Column("Wkrs", 4, right=True),
    ]
    if not compact:
        columns.insert(3, Column("", 16))
    lines = [_header(columns, width)]
    for pod, gpu in _pod_rows(pods):
        name = f"{pod['namespace']}/{pod['name']}"
        if pod.get("error"):
            line = _line(columns[:1], [f"{name}: {pod['error']}"], width)
            line.stylize("red")
            lines.append(line)
            continue
        cells: list[str | Text]
        if gpu is None:
            cells = [name, NA, "", "", "", str(pod.get("workers", 0))]
            share = None
        else:
            limit = gpu.get("memory_limit")
            used = gpu.get("memory_used")
            index = gpu.get("index")
            cells = [
                name,
                str(index) if index is not None else shorten(str(gpu.get("uuid")), 3),
                f"{_size(used)}/{_size(limit) if limit else 'none'}",
                _percent(gpu.get("compute_limit")) if gpu.get("compute_limit") else "none",
                _percent(gpu.get("utilization")),
                str(pod.get("workers", 0)),
            ]
            share = used / limit if used is not None and limit else None
        if not compact:
            cells.insert(3, _bar(share, 16))
        lines.append(_line(columns, cells, width))
    return lines


def _worker_lines(workers: list[dict[str, Any]], width: int, compact: bool) -> list[Text]:
    columns = [
        Column("Pod", 44 if not compact else 18),
        Column("PID", 7, right=True),
        Column("GPU mem", 9, right=True),
        Column("Util", 4, right=True),
        Column("Up", 6, right=True),
        Column("Command", 0),
    ]
    if not compact:
        columns.insert(2, Column("Host PID", 8, right=True))
    lines = [_header(columns, width)]
    now = time.time()
    for worker in workers:
        gpus = worker.get("gpus") or []
        utils = [g["utilization"] for g in gpus if g.get("utilization") is not None]
        started = worker.get("started")
        command = (worker.get("command") or NA) + ("" if worker.get("alive", True) else " (exited)")
        cells: list[str | Text] = [
            f"{worker['namespace']}/{worker['pod']}",
            str(worker["pid"]),
            _size(sum(g.get("memory_used") or 0 for g in gpus)),
            _percent(sum(utils)) if utils else NA,
            NA if started is None else duration(now - started),
            command,
        ]
        if not compact:
            host = worker.get("host_pid")
            cells.insert(2, NA if host is None else str(host))
        lines.append(_line(columns, cells, width))
    return lines


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# --- sorting and filtering ---------------------------------------------------------------


def _pod_memory(pod: dict[str, Any]) -> float:
    return float(sum(g.get("memory_used") or 0 for g in pod.get("gpus") or []))


def _pod_util(pod: dict[str, Any]) -> float:
    return float(sum(g.get("utilization") or 0 for g in pod.get("gpus") or []))


def _worker_memory(worker: dict[str, Any]) -> float:
    return float(sum(g.get("memory_used") or 0 for g in worker.get("gpus") or []))


def _worker_util(worker: dict[str, Any]) -> float:
    return float(sum(g.get("utilization") or 0 for g in worker.get("gpus") or []))


def _arrange(
    items: list[dict[str, Any]],
    state: ViewState,
    name: Callable[[dict[str, Any]], str],
    memory: Callable[[dict[str, Any]], float],
    util: Callable[[dict[str, Any]], float],
) -> list[dict[str, Any]]:
    wanted = state.filter.lower()
    kept = [item for item in items if wanted in name(item).lower()]
    if state.sort == "name":
        return sorted(kept, key=name, reverse=state.reverse)
    # Figures sort largest first (what a top shows first); r turns it around.
    measure = memory if state.sort == "memory" else util
    return sorted(kept, key=lambda item: (-measure(item), name(item)), reverse=state.reverse)


def _pod_name(pod: dict[str, Any]) -> str:
    return f"{pod['namespace']}/{pod['name']}"


def _worker_name(worker: dict[str, Any]) -> str:
    return f"{worker['namespace']}/{worker['pod']} {worker.get('command') or ''}"


# --- the screen --------------------------------------------------------------------------

HELP = (
    "q quit · s sort · r reverse · / filter · Esc clear · c compact/full · h help",
    "s: sort pods and workers by name, memory used or utilization (r: the other way)",
    "/: type part of a pod's name, Enter keeps it, Esc clears; c: compact, full or by width",
)


def _fit(section: list[Text], room: int, width: int) -> list[Text]:
    """A section's header and as many rows as fit in ``room`` lines, then "+N more"."""
    if room <= 0:
        return []
    if len(section) <= room:
        return section
    if room == 1:
        return section[:1]
    shown = room - 1
    more = Text(f"  +{len(section) - shown} more (/ filters, s sorts)", style="dim")
    more.truncate(width)
    return [*section[:shown], more]


def render(snapshot: Snapshot, state: ViewState, width: int, height: int) -> Text:
    """The whole screen: at most ``height`` lines of at most ``width`` cells."""
    width = max(20, width)
    height = max(3, height)
    compact = state.compact(width)
    status = snapshot.status
    title = Text()
    title.append("tf-hypervisor ", style="bold")
    title.append(f"{status.get('version', '')} ")
    title.append(time.strftime("%H:%M:%S", time.localtime(snapshot.taken or time.time())))
    if snapshot.error is None:
        title.append(
            f"  {status.get('pods', 0)} pods, {status.get('workers', 0)} workers  ", style=""
        )
        title.append(str(status.get("backend_description", "")), style="dim")
    title.truncate(width)
    lines = [title]
    if snapshot.error is not None:
        warning = Text(f"daemon unreachable, retrying: {snapshot.error}", style="bold red")
        for start in range(0, len(warning), width):  # the reason in full, over a few lines
            lines.append(warning[start : start + width])
        if snapshot.gpus:
            lines.append(Text("(last view)", style="dim"))
    footer = _footer(state, width)
    room = height - len(lines) - len(footer)
    gpus = _gpu_lines(snapshot.gpus, width, compact)
    pods = _pod_lines(
        _arrange(snapshot.pods, state, _pod_name, _pod_memory, _pod_util), width, compact
    )
    workers = _worker_lines(
        _arrange(snapshot.workers, state, _worker_name, _worker_memory, _worker_util),
        width,
        compact,
    )
    # GPUs first (all of them if they fit), then pods and workers share what is left.
    shown_gpus = _fit(gpus, room, width)
    room -= len(shown_gpus)
    pod_room = max(min(len(pods), room - min(len(workers), 3)), min(room, 2))
    shown_pods = _fit(pods, pod_room, width)
    room -= len(shown_pods)
    shown_workers = _fit(workers, room, width)
    lines += shown_gpus + shown_pods + shown_workers
    lines += [Text()] * max(0, height - len(lines) - len(footer))
    lines += footer
    return Text("\n").join(lines[:height])


def _footer(state: ViewState, width: int) -> list[Text]:
    order = "↑" if state.reverse else "↓"
    mode = state.mode
    status = Text(f"sort: {state.sort}{order}  mode: {mode}", style="dim")
    if state.editing_filter or state.filter:
        status.append(f"  filter: {state.filter}", style="bold")
        if state.editing_filter:
            status.append("_", style="blink")
    lines = [status] + [Text(line) for line in (HELP if state.show_help else HELP[:1])]
    for line in lines:
        line.truncate(width)
    return lines


def apply_key(state: ViewState, key: str) -> bool:
    """Change the view for one key; False when the key asks to quit."""
    if state.editing_filter:
        if key in ("\r", "\n"):
            state.editing_filter = False
        elif key == "\x1b":
            state.filter, state.editing_filter = "", False
        elif key in ("\x7f", "\b"):
            state.filter = state.filter[:-1]
        elif key.isprintable():
            state.filter += key
        return True
    if key in ("q", "Q"):
        return False
    if key == "s":
        state.sort = SORT_KEYS[(SORT_KEYS.index(state.sort) + 1) % len(SORT_KEYS)]
    elif key == "r":
        state.reverse = not state.reverse
    elif key == "/":
        state.editing_filter = True
    elif key == "\x1b":
        state.filter = ""
    elif key in ("h", "?"):
        state.show_help = not state.show_help
    elif key == "c":
        modes = ("auto", "compact", "full")
        state.mode = modes[(modes.index(state.mode) + 1) % len(modes)]
    return True
