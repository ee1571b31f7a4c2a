"""Sizes and compute shares as people write and read them.

Sizes: the limiter's units (docs/configuration.md), ``k``/``KiB``… binary, ``KB``… decimal.
Compute limits: the region keeps them in hundredths of a percent (10000: the whole GPU).
"""

import re
from fractions import Fraction

HUNDREDTHS_PER_PERCENT = 100
WHOLE_GPU = 100 * HUNDREDTHS_PER_PERCENT  # a compute limit of 100 %: none

# ASCII only, as the C parser (vgpu_parse.h): no other digits, blanks or letters.
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE | re.ASCII)
_SIZE_MAX = (1 << 64) - 1  # what a region can hold
_SIZE_UNITS = {
    **dict.fromkeys(("", "b"), 1),
    **dict.fromkeys(("k", "ki", "kib"), 1 << 10),
    **dict.fromkeys(("m", "mi", "mib"), 1 << 20),
    **dict.fromkeys(("g", "gi", "gib"), 1 << 30),
    **dict.fromkeys(("t", "ti", "tib"), 1 << 40),
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE_FORMS = 'expected a number of bytes greater than 0, or a size such as "64MiB"'
_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def parse_size(value: object) -> int:
    """Bytes from an int or a size string ("64MiB", "1.5 GiB", "4GB"). Must be a whole number
    of bytes from 1 to 2**64 - 1 (the C parser's grammar); ValueError (one line) otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value)):
        factor = _SIZE_UNITS.get(match[2].lower())
        # Exact arithmetic: a size is a whole number of bytes, whatever its number of digits.
        exact = Fraction(match[1]) * factor if factor is not None else None
        if exact is None or exact.denominator != 1:
            raise ValueError(_SIZE_FORMS)
        size = int(exact)
    else:
        raise ValueError(_SIZE_FORMS)
    if not 0 < size <= _SIZE_MAX:
        raise ValueError(_SIZE_FORMS)
    return size


def _largest_unit(size: int) -> tuple[int, str]:
    """The largest binary unit (factor, name) that keeps ``size`` at 1 or more; size >= 1024."""
    unit = 0
    while unit + 1 < len(_BINARY_UNITS) and size >= 1024 ** (unit + 2):
        unit += 1
    return 1024 ** (unit + 1), _BINARY_UNITS[unit]


def format_size(size: int) -> str:
    """Exact where the unit divides ("4 GiB"), else two decimals ("1.46 GiB"): for settings
    and limits, which people wrote."""
    if size < 1024:
        return f"{size} B"
    factor, unit = _largest_unit(size)
    if size % factor == 0:
        return f"{size // factor} {unit}"
    return f"{size / factor:.2f} {unit}"


def format_bytes(size: int) -> str:
    """One decimal ("4.0 GiB", "1.5 MiB"): for usage figures in tables."""
    if size < 1024:
        return f"{size} B"
    factor, unit = _largest_unit(size)
    return f"{size / factor:.1f} {unit}"


def percent_to_hundredths(percent: float) -> int:
    """A compute limit in percent as the region keeps it: 12.5 → 1250."""
    return round(percent * HUNDREDTHS_PER_PERCENT)


def hundredths_to_percent(hundredths: int) -> float:
    """A compute limit as the region keeps it, in percent: 1250 → 12.5."""
    return hundredths / HUNDREDTHS_PER_PERCENT


def format_percent(hundredths: int) -> str:
    """Hundredths of a percent as the shortest exact text: 5000 → "50 %", 1250 → "12.5 %";
    the whole GPU is marked "(no limit)"."""
    whole, part = divmod(hundredths, HUNDREDTHS_PER_PERCENT)
    text = f"{whole}.{part:02d}".rstrip("0").rstrip(".")
    return f"{text} %" + (" (no limit)" if hundredths == WHOLE_GPU else "")
