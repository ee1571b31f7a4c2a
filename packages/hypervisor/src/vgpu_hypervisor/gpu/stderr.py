"""Capturing what native code writes to file descriptor 2 during one call."""

import os
import sys
import tempfile
from types import TracebackType
from typing import IO


class CapturedStderr:
    """``with CapturedStderr() as captured:`` sends fd 2 to a temporary file; ``captured.text``
    holds what was written once the block is left. Meant for short calls at start-up: other
    threads' output in that window is captured too (``replay`` writes it back)."""

    def __init__(self) -> None:
        self.text = ""
        self._saved: int | None = None
        self._sink: IO[bytes] | None = None

    def __enter__(self) -> "CapturedStderr":
        _flush()
        sink = tempfile.TemporaryFile()  # closed in __exit__
        try:
            self._saved = os.dup(2)
        except OSError:  # no fd 2 (a detached daemon): nothing to capture
            sink.close()
            return self
        self._sink = sink
        os.dup2(sink.fileno(), 2)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._sink is None or self._saved is None:
            return
        _flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._sink.seek(0)
        self.text = self._sink.read().decode(errors="replace")
        self._sink.close()

    def replay(self, skip: str = "") -> None:
        """Write the captured lines back to stderr, leaving out those starting with ``skip``."""
        lines = self.text.splitlines(keepends=True)
        kept = "".join(line for line in lines if not (skip and line.startswith(skip)))
        if kept and sys.stderr is not None:
            sys.stderr.write(kept)
            sys.stderr.flush()


def _flush() -> None:
    if sys.stderr is not None:
        sys.stderr.flush()
