"""vgpu_common.visible: tenants' text shown with every control character as a visible escape,
the one rule of the CLIs' tables and views and of the daemon's log."""

import unicodedata

from hypothesis import given
from hypothesis import strategies as st
from vgpu_common.visible import CONTROL_CODES, visible

# What a tenant chose as its process's name in the review: a title, a colour, a forged row.
HOSTILE = "\x1b]0;PWNED\x07\x1b[31mred\nfake line\r\x9b2J\x7f\tend"


def test_each_control_character_is_an_escape_and_nothing_else_changes() -> None:
    assert visible(HOSTILE) == (
        "\\x1b]0;PWNED\\x07\\x1b[31mred\\x0afake line\\x0d\\x9b2J\\x7f\\x09end"
    )
    assert visible(HOSTILE, tabs=True).endswith("\\x7f\tend")
    assert visible("GPU-ä [bold]x[/] ~/ü") == "GPU-ä [bold]x[/] ~/ü"


def test_the_control_characters_are_c0_del_c1_and_the_bidirectional_controls() -> None:
    """Unicode's own lists: category Cc is exactly C0, DEL and C1; the embeddings, overrides
    and isolates are the Bidi_Control characters that reorder text (the marks only mark)."""
    controls = {c for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc"}
    reordering = {c for c in range(0x2000, 0x2070) if unicodedata.bidirectional(chr(c)) in
                  ("LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI")}  # fmt: skip
    assert controls | reordering == CONTROL_CODES
    assert visible("evil\u202egpj.exe") == "evil\\u202egpj.exe"


@given(st.text())
def test_what_is_shown_holds_no_control_character_and_escaping_again_changes_nothing(
    text: str,
) -> None:
    shown = visible(text)
    assert not any(ord(char) in CONTROL_CODES for char in shown)
    assert visible(shown) == shown
    assert visible(text, tabs=True).replace("\t", "\\x09") == shown
