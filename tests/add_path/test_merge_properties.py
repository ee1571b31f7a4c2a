"""The C merge rule, called through cffi, agrees with a plain Python statement of the rule."""

import re

from hypothesis import example, given
from hypothesis import strategies as st
from vgpu_add_path import SEPARATORS, merge


def reference_merge(
    current: str | None, prepend: str | None, append: str | None, separators: str
) -> str | None:
    """Prepend then append each non-empty entry not yet present; keep `current` verbatim."""

    def entries(value: str | None) -> list[str]:
        return re.split(f"[{re.escape(separators)}]", value) if value else []

    present = set(entries(current))
    front: list[str] = []
    back: list[str] = []
    for value, added in ((prepend, front), (append, back)):
        for entry in entries(value):
            if entry and entry not in present:
                present.add(entry)
                added.append(entry)
    if not front and not back:
        return None
    return ":".join([*front, *([current] if current else []), *back])


# A small alphabet makes duplicates, empty entries and mixed separators common.
values = st.none() | st.text(alphabet="ab/: .é\t", max_size=24)
separator_sets = st.sampled_from(sorted(set(SEPARATORS.values())))


@given(values, values, values, separator_sets)
@example("/usr/bin:/bin", "/opt/a", "/opt/b", ":")
@example(None, "", "", ":")
@example("a b", "b:c", "c d", ": ")
def test_matches_reference(
    current: str | None, prepend: str | None, append: str | None, separators: str
) -> None:
    assert merge(current, prepend, append, separators) == reference_merge(
        current, prepend, append, separators
    )


@given(values, values, values, separator_sets)
def test_applying_twice_changes_nothing_more(
    current: str | None, prepend: str | None, append: str | None, separators: str
) -> None:
    once = merge(current, prepend, append, separators)
    if once is not None:
        assert merge(once, prepend, append, separators) is None


@given(values, values, values, separator_sets)
def test_result_keeps_current_and_holds_every_requested_entry(
    current: str | None, prepend: str | None, append: str | None, separators: str
) -> None:
    result = merge(current, prepend, append, separators)
    if result is None:
        return
    if current:
        assert current in result
    tokens = set(re.split(f"[{re.escape(separators)}]", result))
    for value in (prepend, append):
        for entry in re.split(f"[{re.escape(separators)}]", value or ""):
            assert entry == "" or entry in tokens
