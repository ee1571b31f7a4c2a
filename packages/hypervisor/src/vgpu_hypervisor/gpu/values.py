"""The "not available" sentinel: what a GPU query gives when the driver cannot answer it."""

import enum
from typing import Final, TypeAlias, TypeVar

T = TypeVar("T")
D = TypeVar("D")


class NotAvailable(enum.Enum):
    """A value the driver did not give (unsupported, no permission, GPU lost...).

    One member, so ``value is NOT_AVAILABLE`` narrows the type; falsy; shown as ``N/A``;
    ``None`` in JSON (see snapshot.to_plain).
    """

    NOT_AVAILABLE = "N/A"

    def __repr__(self) -> str:
        return "N/A"

    def __str__(self) -> str:
        return "N/A"

    def __bool__(self) -> bool:
        return False


NOT_AVAILABLE: Final = NotAvailable.NOT_AVAILABLE

Value: TypeAlias = T | NotAvailable
"""A queried value of type T, or NOT_AVAILABLE."""


def or_default(value: Value[T], default: D) -> T | D:
    """The value, or ``default`` where it is not available."""
    return default if value is NOT_AVAILABLE else value
