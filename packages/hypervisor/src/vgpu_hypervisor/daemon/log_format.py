"""The daemon's log lines: text with ISO 8601 UTC times, or one JSON object a line.

Times are UTC with a `Z` and milliseconds, so lines from nodes in different time zones sort and
compare as they are; a log shipper (Loki, Fluent Bit, Vector) takes the JSON form without a
parsing rule.
"""

import json
import logging
from datetime import UTC, datetime

from vgpu_common.visible import visible


def utc_time(created: float) -> str:
    """ "2026-11-23T18:08:59.123Z" for a record's ``created``."""
    stamp = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
    return stamp.removesuffix("+00:00") + "Z"


class TextFormatter(logging.Formatter):
    """`TIME LEVEL LOGGER: MESSAGE` on one line, with a traceback on the lines after when there
    is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_time(record.created)

    def formatMessage(self, record: logging.LogRecord) -> str:
        # Control characters as escapes (a tab stays): a message names what tenants wrote, a
        # UUID in a region say, and one with a newline put a line of its writer's making in
        # the log.
        return visible(super().formatMessage(record), tabs=True)


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message"}`, plus `exception` (its traceback) when one is
    logged; one line per record whatever the message holds."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, str] = {
            "time": utc_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False)


def formatter(kind: str) -> logging.Formatter:
    """The formatter of the log_format setting ("text" or "json")."""
    return JsonFormatter() if kind == "json" else TextFormatter()
