"""`tf-hypervisor top`: a live view of GPUs, pods and workers, refreshed every interval.

Keys (read in cbreak mode on a terminal, as they come otherwise, so a script can send "q"):
q quits, s/r sort, / filters, c switches compact/full, h shows the help; Ctrl-C quits too. Off
a terminal with no input left to read, the view is printed once and top exits. A daemon that
is not there (at the start or later) is shown in the view, which keeps retrying. Each refresh
adds the GPUs' figures to the history the full mode draws.
"""

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator

from rich.console import Console
from rich.live import Live
from rich.text import Text

from vgpu_hypervisor.client.api_client import Client, ClientError
from vgpu_hypervisor.client.top_view import History, Snapshot, ViewState, apply_key, render


def take_snapshot(client: Client, last: Snapshot | None) -> Snapshot:
    """The daemon's documents now; on failure the last ones, marked with the reason."""
    try:
        return Snapshot(
            status=client.status(),
            gpus=client.gpus(),
            pods=client.pods(),
            workers=client.workers(),
            taken=time.time(),
        )
    except ClientError as error:
        base = last or Snapshot()
        return Snapshot(base.status, base.gpus, base.pods, base.workers, str(error), time.time())


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


def _read_keys(fd: int | None, timeout: float) -> list[str] | None:
    """Keys typed within ``timeout`` ([] if none); None once input has ended."""
    if fd is None:
        time.sleep(timeout)
        return []
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return []
    data = os.read(fd, 64)
    if not data:
        return None
    text = data.decode(errors="replace")
    if text.startswith("\x1b[") or text.startswith("\x1bO"):  # arrows and the like: unused
        return []
    return list(text)


def run_top(client: Client, *, interval: float = 1.0, console: Console | None = None) -> None:
    """Show the view until q or Ctrl-C."""
    console = console or Console()
    state = ViewState()
    history = History()
    snapshot = take_snapshot(client, None)
    history.record(snapshot)

    def frame() -> Text:
        width, height = console.size
        return render(snapshot, state, width, height, history)

    try:
        with (
            _keys() as terminal_fd,
            Live(
                frame(),
                console=console,
                screen=console.is_terminal,
                auto_refresh=False,
                vertical_overflow="crop",
            ) as live,
        ):
            fd = terminal_fd
            next_refresh = time.monotonic() + interval
            while True:
                keys = _read_keys(fd, max(0.0, next_refresh - time.monotonic()))
                if keys is None:  # end of input: nothing can ask to quit any more
                    fd = None
                    keys = []
                if fd is None and not console.is_terminal:
                    # Off a terminal Live shows only its last frame, as top quits, and with no
                    # input nothing can ask it to: `top > file < /dev/null` waited for ever
                    # and printed nothing. The view once, as `top -b -n 1` does.
                    return
                if not all(apply_key(state, key) for key in keys):
                    return
                if time.monotonic() >= next_refresh:
                    snapshot = take_snapshot(client, snapshot)
                    history.record(snapshot)
                    next_refresh = time.monotonic() + interval
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:
        pass
