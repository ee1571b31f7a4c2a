"""`-w/--watch` on the listings, as kubectl's: the listing, then again each time it changes,
until Ctrl-C (exit 0). A daemon that stops answering ends the watch with its one-line error."""

import time
from collections.abc import Callable
from typing import Any

INTERVAL = 1.0  # seconds between looks


def watch(
    take: Callable[[], Any],
    show: Callable[[Any], None],
    interval: float = INTERVAL,
    flush: Callable[[], None] = lambda: None,
) -> None:
    """``show`` what ``take`` returns, and again whenever it returns something else."""
    shown: Any = object()
    try:
        while True:
            document = take()
            if document != shown:
                show(document)
                flush()
                shown = document
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
