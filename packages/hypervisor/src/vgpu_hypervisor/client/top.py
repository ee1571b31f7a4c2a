"""`tf-hypervisor top`: a live view of GPUs, pods and workers, refreshed every second.

Quits on q (or Q) and on Ctrl-C, restoring the terminal. Keys are read in cbreak mode when
stdin is a terminal, and line by line otherwise (so a script can send "q"). A daemon that stops
answering is shown in the view, which keeps trying.
"""

import contextlib
import os
import select
import sys
import termios
import tty
from collections.abc import Iterator

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from vgpu_hypervisor.client.api_client import API, Client, ClientError
from vgpu_hypervisor.client.tables import top_view


def _frame(client: Client) -> RenderableType:
    return top_view(
        client.get(f"{API}/status"),
        client.get(f"{API}/gpus"),
        client.get(f"{API}/pods"),
        client.get(f"{API}/workers"),
    )


@contextlib.contextmanager
def _keys() -> Iterator[int | None]:
    """stdin's descriptor for key reads (None when there is no stdin), cbreak on a terminal."""
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError, AttributeError):
        yield None
        return
    if not os.isatty(fd):
        yield fd
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(fd: int | None, timeout: float) -> bool:
    """Wait up to ``timeout`` for input; True if it asks to quit."""
    if fd is None:
        select.select([], [], [], timeout)
        return False
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return False
    data = os.read(fd, 64)
    if not data:  # end of input: nothing more can ask us to quit, keep refreshing
        select.select([], [], [], timeout)
        return False
    return b"q" in data.lower()


def run_top(client: Client, *, interval: float = 1.0, console: Console | None = None) -> None:
    """Show the view until q or Ctrl-C; ClientError if the daemon cannot be reached at first."""
    console = console or Console()
    last = _frame(client)  # the first failure is an error, not a blank view
    try:
        with _keys() as fd, Live(last, console=console, screen=False, auto_refresh=False) as live:
            while not _quit_pressed(fd, interval):
                shown: RenderableType
                try:
                    last = shown = _frame(client)
                except ClientError as error:
                    shown = Group(Text(f"daemon unreachable: {error}", style="red"), last)
                live.update(shown, refresh=True)
    except KeyboardInterrupt:
        pass
