"""Text that others wrote, made safe to show: each control character as a visible escape.

Much of what the tools show is tenants' text: a worker's command line (its process name is
the tenant's to choose), a region's namespace, name and GPU UUIDs (its words are the tenant's
to write). Shown raw, an escape sequence in one ran in the admin's terminal (retitled it,
recoloured or cleared the screen) and a newline forged a row of a table or a line of the log.
Every C0 control character, DEL and every C1 control character (which some terminals obey as
the escape sequences they stand for) is shown as ``\\x1b`` writes it, and the bidirectional
controls as ``\\u202e``. The one rule for the CLIs' tables and views, and the daemon's log.
"""

from typing import Final

# C0, DEL, C1; and the bidirectional embeddings, overrides and isolates, which reorder what a
# terminal shows (a name that reads as another, a row's cells swapped).
CONTROL_CODES: Final = frozenset(
    (*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))
)
_ESCAPES: Final = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in CONTROL_CODES
}
_ESCAPES_BUT_TAB: Final = {code: escape for code, escape in _ESCAPES.items() if code != 0x09}


def visible(text: str, *, tabs: bool = False) -> str:
    """``text`` with each control character as its escape (``\\x1b``, ``\\x0a``); ``tabs``: a
    tab stays a tab (a log line, where it lines nothing up). What it gives is printable, so
    escaping twice changes nothing."""
    return text.translate(_ESCAPES_BUT_TAB if tabs else _ESCAPES)
