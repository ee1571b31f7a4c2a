"""Tables that fit the terminal as kubectl's do: every row on one line, no name or number cut.

Columns that do not fit drop by priority (``-o wide`` keeps them all); the one flexible column
(a command line, an error) gets what is left and is trimmed to it by its own rule.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text
from vgpu_common.visible import visible

ELLIPSIS = "…"


def trim(text: str, width: int) -> str:
    """``text`` in ``width`` cells, ending in "…" when cut."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    while cell_len(text) > width - 1:
        text = text[:-1]
    return text + ELLIPSIS


@dataclass(frozen=True)
class Column:
    """``drop``: 0 never drops; the highest drops first. ``flexible``: takes what is left,
    through ``shorten`` (text, width); at least ``least`` cells or it drops."""

    title: str
    drop: int = 0
    right: bool = False
    flexible: bool = False
    least: int = 12
    shorten: Callable[[str, int], str] = trim


def _overhead(count: int) -> int:
    """Cells a SIMPLE_HEAD table adds to its columns: an edge each side, one cell of padding
    each side of a column, one between columns."""
    return 2 + 2 * count + (count - 1)


def table_width(widths: Sequence[int]) -> int:
    return sum(widths) + _overhead(len(widths))


def print_table(table: Table, width: int) -> None:
    """Print ``table`` at ``width`` cells, or wider where what it must show whole does not
    fit (a name longer than the terminal): the terminal wraps that line, nothing is cut."""
    from rich.console import Console
    from rich.measure import Measurement

    wide = Console(width=100_000)
    needed = Measurement.get(wide, wide.options, table).maximum
    Console(width=max(width, needed), soft_wrap=needed > width).print(table)


def fitted(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    width: int | None,
    styles: Sequence[str | None] = (),
) -> Table:
    """A table of ``rows`` (one cell per column) in ``width`` cells: columns dropped by
    priority and the flexible one shortened; None: every column, nothing shortened."""
    # A cell holds what tenants wrote (a command line, a region's UUID): its control
    # characters as escapes, measured as shown, so that no escape sequence reaches the
    # terminal and no newline makes a row of its own.
    rows = [[visible(cell) for cell in row] for row in rows]
    natural = [
        max([cell_len(column.title), *(cell_len(row[n]) for row in rows)])
        for n, column in enumerate(columns)
    ]
    kept = list(range(len(columns)))

    def needed(indexes: list[int]) -> int:
        least = [
            min(natural[i], max(columns[i].least, cell_len(columns[i].title)))
            if columns[i].flexible
            else natural[i]
            for i in indexes
        ]
        return table_width(least)

    if width is not None:
        while needed(kept) > width:
            droppable = [i for i in kept if columns[i].drop]
            if not droppable:
                break
            kept.remove(max(droppable, key=lambda i: (columns[i].drop, i)))
    widths = {i: natural[i] for i in kept}
    flexible = [i for i in kept if columns[i].flexible]
    if width is not None and flexible:
        fixed = sum(natural[i] for i in kept if not columns[i].flexible)
        room = width - fixed - _overhead(len(kept))
        for i in flexible:
            widths[i] = max(cell_len(columns[i].title), min(natural[i], room // len(flexible)))
    table = Table(box=box.SIMPLE_HEAD, expand=False, pad_edge=True)
    for i in kept:
        column = columns[i]
        table.add_column(
            column.title,
            justify="right" if column.right else "left",
            no_wrap=True,
            overflow="fold",  # only a name wider than the whole terminal: shown in full
            min_width=widths[i],
        )
    for number, row in enumerate(rows):
        # Text, not markup: a cell holds what tenants wrote (a command line, a region's UUID),
        # and "[/x]" in one failed the whole listing.
        cells = [
            Text(columns[i].shorten(row[i], widths[i]) if columns[i].flexible else row[i])
            for i in kept
        ]
        table.add_row(*cells, style=styles[number] if number < len(styles) else None)
    return table
