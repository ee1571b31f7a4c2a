"""A worker's command line in a narrow column, as nvitop shows it: the program's name first (not
its folder), then as many of its arguments as fit, trimmed at the end."""

from pathlib import PurePath

from rich.cells import cell_len

from vgpu_hypervisor.client.fit import trim


def program_first(command: str) -> str:
    """``command`` with its program's folder left out: "/usr/bin/python3 x.py" → "python3 x.py"."""
    program, space, arguments = command.strip().partition(" ")
    return PurePath(program).name + space + arguments if program else command


def short_command(command: str, note: str = "", *, width: int) -> str:
    """``command`` in ``width`` cells, program first; ``note`` ("(exited)") is kept whole after
    it where there is room for both."""
    text = program_first(command)
    if not note:
        return trim(text, width)
    room = width - cell_len(note) - 1
    if room < 4:
        return trim(f"{text} {note}", width)
    return f"{trim(text, room)} {note}"
