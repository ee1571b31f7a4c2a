"""The screen of `tf-hypervisor top`, laid out for the terminal's size.

Rows are fitted by hand rather than by rich tables so that the view never wraps or ends in a
cropped line: every column has a width, the flexible columns (GPU name, pod, command) take what
is left, and sections that do not fit the height end in "+N more". Text is cut only between
words. Below 120 columns the compact mode drops the bars, the history, the boost and the host
pid; the GPU index, memory, Util, Temp and Power always stay. The full mode shows each GPU's
utilization and memory over the last refreshes, kept by ``History`` in the client.
"""

import textwrap
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from vgpu_common.limits import format_bytes, format_percent
from vgpu_common.visible import visible

from vgpu_hypervisor.client.command_line import short_command
from vgpu_hypervisor.client.fit import trim
from vgpu_hypervisor.client.tables import gpu_indexes, worker_gpus

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


@dataclass
class History:
    """Each GPU's utilization and memory share at the last ``size`` refreshes, oldest first,
    by GPU UUID (or index): what the daemon does not keep, the client gathers as it refreshes."""

    size: int = 300
    samples: dict[str, deque[tuple[float, float | None, float | None]]] = field(
        default_factory=dict
    )
    last: float = 0.0

    def record(self, snapshot: Snapshot) -> None:
        """Add ``snapshot``'s figures once (a failed refresh, or the same one again, adds none)."""
        if snapshot.error is not None or snapshot.taken == self.last:
            return
        self.last = snapshot.taken
        for gpu in snapshot.gpus:
            util = gpu.get("utilization")
            used, total = gpu.get("memory_used"), gpu.get("memory_total")
            sample = (
                snapshot.taken,
                None if util is None else util / 100,
                used / total if used is not None and total else None,
            )
            self.samples.setdefault(_gpu_key(gpu), deque(maxlen=self.size)).append(sample)

    def of(self, gpu: dict[str, Any]) -> list[tuple[float, float | None, float | None]]:
        return list(self.samples.get(_gpu_key(gpu), ()))


def _gpu_key(gpu: dict[str, Any]) -> str:
    return str(gpu.get("uuid") or gpu.get("index"))


@dataclass(frozen=True)
class Column:
    title: str
    width: int  # 0: the flexible column
    right: bool = False
    most: int = 1000  # the flexible column's widest
    fit: Callable[[str, int], str] | None = None  # how a cell too long is shortened


def words(text: str, width: int) -> str:
    """``text`` in ``width`` cells, cut only between words and ending in "…" when cut (a
    first word wider than ``width`` is the one thing cut inside)."""
    if cell_len(text) <= width:
        return text
    head = text[: max(0, width - 1)]
    if not text[len(head)].isspace():
        space = head.rfind(" ")
        if space <= 0:
            return trim(text, width)
        head = head[:space]
    return head.rstrip() + "…"


def wrap(text: str, width: int) -> list[str]:
    """``text`` over lines of at most ``width`` cells, broken between words."""
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def pack(items: Sequence[str], width: int, separator: str = " · ") -> list[str]:
    """``items`` joined by ``separator``, over as many lines as ``width`` needs; an item is
    never split."""
    lines: list[str] = []
    for item in items:
        if lines and cell_len(lines[-1] + separator + item) <= width:
            lines[-1] += separator + item
        else:
            lines.append(words(item, width))
    return lines


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
    """One row: fixed columns as given, the flexible one gets the rest; never wider than width.
    A text cell's control characters are escapes (a pod's name, a command line and a region's
    UUID are tenants' text): no escape sequence reaches the terminal, no newline adds a row."""
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
            text = (column.fit or shorten)(visible(cell), size)
            line.append(text.rjust(size) if column.right else text.ljust(size))
    line.truncate(width)
    line.rstrip()
    return line


def _header(columns: Sequence[Column], width: int) -> Text:
    line = _line(columns, [c.title for c in columns], width)
    line.stylize("bold reverse")
    return line


# --- the sections ------------------------------------------------------------------------


def _gpu_columns(gpus: list[dict[str, Any]], width: int, compact: bool) -> list[Column]:
    """The GPU rows' columns. Full mode: the name whole (up to 32 cells), then bars in what
    is left; compact: the name last, in as much as fits."""
    columns = [
        Column("GPU", 3, right=True),
        Column("Memory used/total", 17, right=True),
        Column("Util", 4, right=True),
        Column("Temp", 5, right=True),
        Column("Power", 6, right=True),
    ]
    if compact:
        return [
            *columns,
            Column("Pods", 4, right=True),
            Column("Wkrs", 4, right=True),
            Column("Name", 0, fit=words),
        ]
    name = min(32, max([4, *(cell_len(gpu.get("name") or NA) for gpu in gpus)]))
    columns[1:1] = [Column("Name", name, fit=words)]
    columns += [
        Column("Boost", 5, right=True),
        Column("Pods", 4, right=True),
        Column("Wkrs", 4, right=True),
    ]
    left = width - sum(c.width for c in columns) - len(columns) + 1
    memory_bar = min(16, (left - 2) // 2)
    util_bar = min(10, left - 2 - memory_bar)
    if util_bar >= 4:  # after memory and after Util, as nvitop shows them
        columns.insert(3, Column("", memory_bar))
        columns.insert(5, Column("", util_bar))
    return columns


def _gpu_lines(gpus: list[dict[str, Any]], width: int, compact: bool) -> list[Text]:
    columns = _gpu_columns(gpus, width, compact)
    lines = [_header(columns, width)]
    for gpu in gpus:
        used, total = gpu.get("memory_used"), gpu.get("memory_total")
        util = gpu.get("utilization")
        cells: dict[str, str | Text] = {
            "GPU": str(gpu["index"]),
            "Name": gpu.get("name") or NA,
            "Memory used/total": f"{_size(used)}/{_size(total)}",
            "Util": _percent(util),
            "Temp": NA if gpu.get("temperature_c") is None else f"{gpu['temperature_c']}C",
            "Power": NA if gpu.get("power_draw_w") is None else f"{gpu['power_draw_w']:.0f}W",
            "Boost": NA if gpu.get("boost") is None else f"{gpu['boost']:.2f}",
            "Pods": str(gpu.get("pods", 0)),
            "Wkrs": str(gpu.get("workers", 0)),
        }
        shares = iter(
            [
                used / total if used is not None and total else None,
                None if util is None else util / 100,
            ]
        )
        row = [
            _bar(next(shares), column.width) if column.title == "" else cells[column.title]
            for column in columns
        ]
        lines.append(_line(columns, row, width))
    return lines


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(shares: Sequence[float | None], width: int) -> str:
    """The last ``width`` shares (0 to 1) as bars of eighths, newest on the right; a gap where
    there was no figure."""
    recent = shares[-width:] if width > 0 else []
    marks = [
        " " if share is None else SPARKS[round(max(0.0, min(1.0, share)) * (len(SPARKS) - 1))]
        for share in recent
    ]
    return "".join(marks).rjust(width)


def _history_lines(
    gpus: list[dict[str, Any]], history: History, width: int, now: float
) -> list[Text]:
    """Per GPU, its utilization and memory over the refreshes kept, side by side."""
    graph = (width - 3 - 2 * 6 - 4) // 2
    kept = [history.of(gpu) for gpu in gpus]
    shown = [samples[-graph:] for samples in kept if samples]
    if graph < 8 or not shown:
        return []
    span = duration(now - min(samples[0][0] for samples in shown))
    columns = [
        Column("GPU", 3, right=True),
        Column(f"Util over {span}, peak", graph + 6),
        Column(f"Memory over {span}, peak", graph + 6),
    ]
    lines = [_header(columns, width)]
    for gpu, samples in zip(gpus, kept, strict=True):
        utils = [util for _, util, _ in samples]
        memory = [share for _, _, share in samples]
        cells = [
            str(gpu["index"]),
            f"{sparkline(utils, graph)} {_peak(utils)}",
            f"{sparkline(memory, graph)} {_peak(memory)}",
        ]
        lines.append(_line(columns, cells, width))
    return lines


def _peak(shares: Sequence[float | None]) -> str:
    """The highest share shown, as a percent in 5 cells ("max" of the graph beside it)."""
    known = [share for share in shares if share is not None]
    return f"{max(known) * 100:4.0f}%" if known else f"{NA:>5}"


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


def _worker_lines(
    workers: list[dict[str, Any]], indexes: dict[str, int], width: int, compact: bool
) -> list[Text]:
    """``indexes``: GPU index by UUID, to name a worker's GPUs as the GPU rows do."""
    now = time.time()
    rows: list[list[str]] = []
    notes: dict[str, tuple[str, str]] = {}  # a Command cell: its command and note
    for worker in workers:
        gpus = worker.get("gpus") or []
        utils = [g["utilization"] for g in gpus if g.get("utilization") is not None]
        started = worker.get("started")
        # Escaped here, not only by _line: the Command cell finds its parts by the text shown.
        command = visible(worker.get("command") or NA)
        note = "" if worker.get("alive", True) else "(exited)"
        notes[f"{command} {note}".rstrip()] = (command, note)
        host = worker.get("host_pid")
        rows.append(
            [
                visible(f"{worker['namespace']}/{worker['pod']}"),  # measured as shown
                str(worker["pid"]),
                NA if host is None else str(host),
                worker_gpus(worker, indexes),
                _size(sum(g.get("memory_used") or 0 for g in gpus)),
                _percent(sum(utils)) if utils else NA,
                NA if started is None else duration(now - started),
                f"{command} {note}".rstrip(),
            ]
        )

    def program_first(cell: str, room: int) -> str:
        return short_command(*notes.get(cell, (cell, "")), width=room)

    gpu = max([3, *(cell_len(row[3]) for row in rows)])
    fixed = [
        Column("PID", 7, right=True),
        Column("Host PID", 8, right=True),
        Column("GPU", gpu),
        Column("GPU mem", 9, right=True),
        Column("Util", 4, right=True),
        Column("Up", 6, right=True),
    ]
    room = width - sum(c.width for c in fixed) - len(fixed) - 1
    if compact or room < 40:  # the host pid only where the pod and command keep room
        room += fixed[1].width + 1
        del fixed[1]
        for row in rows:
            del row[2]
    # The pod and the command share what is left: the pod whole where the command keeps 20
    # cells, never less than two fifths of it.
    pod = max([3, *(cell_len(row[0]) for row in rows)])
    pod = max(3, min(pod, max(room - 20, room * 2 // 5)))
    columns = [
        Column("Pod", pod),
        *fixed,
        Column("Command", max(7, room - pod), fit=program_first),
    ]
    lines = [_header(columns, width)]
    lines += [_line(columns, row, width) for row in rows]
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


def _title(snapshot: Snapshot, width: int) -> Text:
    """The first line: what fits of program, version, time, counts and backend, each whole."""
    status = snapshot.status
    parts = [
        ("tf-hypervisor", "bold"),
        (str(status.get("version", "")), ""),
        (time.strftime("%H:%M:%S", time.localtime(snapshot.taken or time.time())), ""),
    ]
    if snapshot.error is None:
        parts.append((f" {status.get('pods', 0)} pods, {status.get('workers', 0)} workers", ""))
        parts.append((f" {status.get('backend_description', '')}", "dim"))
    title = Text()
    for shown, style in parts:
        part = visible(shown)  # the daemon's words, or those of whatever answers there
        if not part.strip():
            continue
        room = width - len(title) - (1 if title else 0)
        text = part
        if cell_len(part) > room:  # the backend's words that fit; anything else whole or not
            if style != "dim" or room < 12:
                break
            text = " " + words(part.strip(), room - 1)
        title.append(" " if title else "")
        title.append(text, style=style)
    return title


def render(
    snapshot: Snapshot,
    state: ViewState,
    width: int,
    height: int,
    history: History | None = None,
) -> Text:
    """The whole screen: at most ``height`` lines of at most ``width`` cells; ``history``
    (full mode): each GPU's figures at the last refreshes."""
    width = max(20, width)
    height = max(3, height)
    compact = state.compact(width)
    lines = [_title(snapshot, width)]
    if snapshot.error is not None:  # the reason in full, over a few lines
        reason = visible(f"daemon unreachable, retrying: {snapshot.error}")
        lines += [Text(line, style="bold red") for line in wrap(reason, width)]
        if snapshot.gpus:
            lines.append(Text("(last view)", style="dim"))
    footer = _footer(state, width)
    room = height - len(lines) - len(footer)
    gpus = _gpu_lines(snapshot.gpus, width, compact)
    trend = (
        []
        if compact or history is None
        else _history_lines(snapshot.gpus, history, width, snapshot.taken or time.time())
    )
    pods = _pod_lines(
        _arrange(snapshot.pods, state, _pod_name, _pod_memory, _pod_util), width, compact
    )
    workers = _worker_lines(
        _arrange(snapshot.workers, state, _worker_name, _worker_memory, _worker_util),
        gpu_indexes(snapshot.gpus),
        width,
        compact,
    )
    # GPUs first (all of them if they fit), their history where pods and workers keep a few
    # lines, then pods and workers share what is left.
    shown_gpus = _fit(gpus, room, width)
    room -= len(shown_gpus)
    wanted = min(len(pods), 3) + min(len(workers), 3)
    shown_trend = trend if len(trend) + wanted <= room else []
    room -= len(shown_trend)
    pod_room = max(min(len(pods), room - min(len(workers), 3)), min(room, 2))
    shown_pods = _fit(pods, pod_room, width)
    room -= len(shown_pods)
    shown_workers = _fit(workers, room, width)
    lines += shown_gpus + shown_trend + shown_pods + shown_workers
    lines += [Text()] * max(0, height - len(lines) - len(footer))
    lines += footer
    return Text("\n").join(lines[:height])


def _footer(state: ViewState, width: int) -> list[Text]:
    order = "↑" if state.reverse else "↓"
    status = Text(f"sort: {state.sort}{order}  mode: {state.mode}", style="dim")
    if state.editing_filter or state.filter:
        room = width - len(status) - len("  filter: _")
        typed = state.filter if cell_len(state.filter) <= room else "…" + state.filter[-room + 1 :]
        status.append(f"  filter: {typed}", style="bold")
        if state.editing_filter:
            status.append("_", style="blink")
    lines = [status]
    lines += [Text(line) for line in pack(HELP[0].split(" · "), width)]
    if state.show_help:
        lines += [Text(line) for text in HELP[1:] for line in wrap(text, width)]
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
