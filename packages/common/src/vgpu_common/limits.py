"""The words of a pod's limits, one of each: sizes, compute percents, switches, Kubernetes
quantities, the scheduling classes, GPU keys, and one GPU's limits as a value.

Every reader parses and formats with these: both CLIs, the API's models, a Kubernetes pod's
annotations and resources, the device plugin, the scheduler and the region's Python side. So
a value means the same, and is refused with the same one line, wherever it is written.

Why here and not beside the region in vgpu_limiter: the CLI reads its flags before any request
and the pod source reads annotations; neither should load the region library (cffi, a native
file) to read a number. The values the region header also defines (the classes, the whole GPU
in hundredths) are restated here, and a test holds them to ``vgpu_limiter.region.CONSTANTS``,
which is read from vgpu_region.h.

Units are the region's: memory in bytes, compute in hundredths of a percent (WHOLE_GPU is
100 %). "No limit" is None everywhere above the region's words, where it is 0; "leave it as
it is" (a change) is UNCHANGED.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Final

# --- sizes: the limiter's grammar (vgpu_parse.c), held equal to it by a test ------------------

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
# More digits than any limit's number has, once the zeros that change nothing are dropped: a
# size is below 2**64 (20 digits), and a fraction of more than 40 digits is never a whole
# number of bytes in any unit. Refused before int() sees them: past 4300 digits it raised
# "Exceeds the limit (4300 digits) for integer string conversion ... use
# sys.set_int_max_str_digits()", which the CLI and the API passed on as their error.
_MOST_DIGITS: Final = 64


def _significant(whole: str, fraction: str = "") -> tuple[str, str] | None:
    """The digits of a number ``whole``.``fraction`` without its leading zeros and its
    fraction's trailing zeros ("0005" is 5, as the C parser reads it); None when more than
    _MOST_DIGITS are left."""
    whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
    return (whole, fraction) if len(whole) + len(fraction) <= _MOST_DIGITS else None


def parse_size(value: object) -> int:
    """Bytes from an int or a size string ("64MiB", "1.5 GiB", "4GB"). Must be a whole number
    of bytes from 1 to 2**64 - 1 (the C parser's grammar); ValueError (one line) otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value)):
        factor = _SIZE_UNITS.get(match[2].lower())
        number, _, decimals = match[1].partition(".")
        digits = _significant(number, decimals)
        if factor is None or digits is None:
            raise ValueError(_SIZE_FORMS)
        # Exact arithmetic: a size is a whole number of bytes, whatever its number of digits.
        whole, fraction = digits
        exact = Fraction(int(whole + fraction), 10 ** len(fraction)) * factor
        if exact.denominator != 1:
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


# --- compute percents -------------------------------------------------------------------------

HUNDREDTHS_PER_PERCENT: Final = 100
WHOLE_GPU: Final = 100 * HUNDREDTHS_PER_PERCENT  # VGPU_COMPUTE_UNLIMITED: a limit of 100 % is none
# One range for every reader, 0.01 to 100 %: a hundredth is what the region can hold, and what
# the limiter's variables, `tf-limiter run` and the API have always taken (an inference pod may
# well want 0.5 %). The annotations' floor of 1 % was the one exception, and kept a pod from
# asking for what the API could set.
_PERCENT = re.compile(r"[ \t]*([0-9]+)(?:\.([0-9]+))?[ \t]*%?[ \t]*", re.ASCII)
_PERCENT_FORMS = "expected a percent from 0.01 to 100 with at most two decimals"


def parse_percent(value: object) -> int:
    """Hundredths of a percent from a number or a text as the limiter's C parser reads it:
    digits, up to two decimals (more only if zeros), an optional "%", blanks around ("30",
    "12.5", "12.5 %", 0.5). From 0.01 to 100; ValueError (one line) otherwise."""
    if isinstance(value, str) and (match := _PERCENT.fullmatch(value)):
        digits = _significant(match[1], match[2] or "")
        if digits is None or len(digits[1]) > 2 or len(digits[0]) > 3:
            raise ValueError(_PERCENT_FORMS)
        whole, decimals = digits
        hundredths = int(whole) * HUNDREDTHS_PER_PERCENT + int((decimals + "00")[:2])
    elif isinstance(value, int) and not isinstance(value, bool) and not -1000 <= value <= 1000:
        # Past any percent: an integer too large for a float (or for repr) is refused as one.
        raise ValueError(_PERCENT_FORMS)
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        # A JSON number: exact at the digits it was written with (12.3, not 12.300000000000001).
        try:
            exact = Decimal(repr(value)) * HUNDREDTHS_PER_PERCENT
        except InvalidOperation:
            raise ValueError(_PERCENT_FORMS) from None
        if exact != exact.to_integral_value():
            raise ValueError(_PERCENT_FORMS)
        hundredths = int(exact)
    else:
        raise ValueError(_PERCENT_FORMS)
    if not 1 <= hundredths <= WHOLE_GPU:
        raise ValueError(_PERCENT_FORMS)
    return hundredths


def hundredths_to_percent(hundredths: int) -> float:
    """A compute share as the region keeps it, in percent (the API's unit): 1250 → 12.5."""
    return hundredths / HUNDREDTHS_PER_PERCENT


def format_percent(percent: float, unit: str = " %") -> str:
    """A percent as its shortest text at two decimals: 50 → "50 %", 12.5 → "12.5 %";
    ``unit="%"`` for the narrow columns of tables and the live view ("12.5%")."""
    return f"{percent:.2f}".rstrip("0").rstrip(".") + unit


# --- switches and Kubernetes quantities -------------------------------------------------------

_TRUE: Final = ("true", "yes", "on", "1")
_FALSE: Final = ("false", "no", "off", "0")


def parse_switch(value: object) -> bool:
    """A bool, or a text: true/yes/on/1 or false/no/off/0, any case, blanks around; ValueError
    (one line) otherwise. The same words for settings and annotations."""
    if isinstance(value, bool):
        return value
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in _TRUE + _FALSE:
        raise ValueError("expected true or false")
    return text in _TRUE


# A Kubernetes quantity (k8s.io/apimachinery resource.Quantity): the API server writes a whole
# number as it likes best, 1000 as "1k", so a count is read in every form it may take.
_QUANTITY = re.compile(
    r"\s*\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,3})?\s*",
    re.ASCII,
)
_QUANTITY_SUFFIXES: Final = {
    **{f"{p}i": Fraction(1024) ** (n + 1) for n, p in enumerate("KMGTPE")},
    **{p: Fraction(10) ** (3 * (n + 1)) for n, p in enumerate("kMGTPE")},
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
}
QUANTITY_MAX: Final = 999_999_999  # GPUs, memory units or percent: a larger count is a typo


def parse_quantity(text: str, most: int = QUANTITY_MAX) -> int:
    """A resource quantity that is a whole number from 0 to ``most``, in any form the API
    server writes it ("4", "1k", "2Ki", "1e3", "3000m"); ValueError (one line) otherwise."""
    match = _QUANTITY.fullmatch(text) if len(text) <= 64 else None
    if match is None:
        raise ValueError("expected a whole number")
    suffix = match[2] or ""
    if suffix[:1] in ("e", "E"):
        factor = Fraction(10) ** int(suffix[1:])
    else:
        factor = _QUANTITY_SUFFIXES[suffix]
    value = Fraction(match[1]) * factor
    if value.denominator != 1 or value > most:
        raise ValueError(f"expected a whole number from 0 to {most}")
    return int(value)


# --- scheduling classes -----------------------------------------------------------------------


class Qos(enum.IntEnum):
    """A pod's scheduling class, valued as the region stores it (VGPU_QOS_* of vgpu_region.h).
    Its weight divides a GPU whose limits add up past the whole GPU, unless the pod has a
    weight of its own."""

    LOW = 0
    MEDIUM = 1  # the default
    HIGH = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        """Its name as people write it: "low", "medium", "high", "critical"."""
        return self.name.lower()

    @property
    def weight(self) -> int:
        """1, 2, 4, 8: each class weighs twice the one below."""
        return 1 << self.value


QOS_NAMES: Final = tuple(qos.label for qos in Qos)
MAX_WEIGHT: Final = 1_000_000  # an explicit weight: 0 (the class's) to this


def parse_qos(value: object) -> Qos:
    """The class a name gives (any case, blanks around); ValueError otherwise."""
    text = value.strip().lower() if isinstance(value, str) else None
    for qos in Qos:
        if qos.label == text:
            return qos
    raise ValueError(f"expected {', '.join(QOS_NAMES[:-1])} or {QOS_NAMES[-1]}")


def qos_of(word: int) -> Qos:
    """The class a region's word holds; medium for a word that is none (a tenant can write
    its region's words)."""
    try:
        return Qos(word)
    except ValueError:
        return Qos.MEDIUM


# --- GPU keys: an index on the node, or a UUID ------------------------------------------------

_GPU_INDEX = r"0|[1-9][0-9]{0,2}"
# As NVML writes it: "GPU-" and 32 hex digits in groups 8-4-4-4-12; read in any case, as the
# limiter reads it (vgpu_config_parse_uuid). Classes, not a flag: the pattern goes to OpenAPI.
_HEX = "[0-9a-fA-F]"
_GPU_UUID = rf"[Gg][Pp][Uu]-{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
GPU_KEY_PATTERN: Final = rf"^(?:{_GPU_INDEX}|{_GPU_UUID})$"  # for OpenAPI parameters
_INDEX = re.compile(_GPU_INDEX, re.ASCII)
_UUID = re.compile(_GPU_UUID, re.ASCII)
GPU_KEY_FORMS: Final = (
    "a device index (0, 1, ...) or a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
)


def normalize_uuid(uuid: str) -> str:
    """A GPU UUID as NVML writes it ("GPU-" and lower-case hex); ValueError if it is none."""
    if not _UUID.fullmatch(uuid):
        raise ValueError(
            f"bad GPU UUID {uuid!r}: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
        )
    return "GPU-" + uuid[4:].lower()


def parse_gpu_key(text: str) -> str:
    """A GPU as people name it: its index on the node, or its UUID (any case; given back as
    NVML writes it). ValueError naming the key otherwise."""
    if _INDEX.fullmatch(text):
        return text
    if _UUID.fullmatch(text):
        return normalize_uuid(text)
    raise ValueError(f"bad GPU key {text!r}: {GPU_KEY_FORMS}")


def names_gpu(key: str, index: int | None, uuid: str | None) -> bool:
    """Whether a GPU key names the GPU of this ``index`` and ``uuid`` (either may be unknown)."""
    if _INDEX.fullmatch(key):
        return index is not None and int(key) == index
    return uuid is not None and key.lower() == uuid.lower()


# --- one GPU's limits -------------------------------------------------------------------------


class Unchanged(enum.Enum):
    """The type of UNCHANGED."""

    UNCHANGED = "unchanged"


UNCHANGED: Final = Unchanged.UNCHANGED
Limit = int | Unchanged | None  # a limit in a change: a value, UNCHANGED, or None (no limit)
NONE_WORD: Final = "none"  # how a request writes "no limit"


@dataclass(frozen=True, slots=True)
class GpuLimits:
    """A GPU's limits in the region's units: ``memory`` bytes; ``compute`` hundredths of a
    percent below the whole GPU; ``burst`` (the soft limit: the pod's share while no other
    pod wants the GPU) hundredths, at least ``compute``; ``oversubscribe``: past the memory
    limit, host memory. None: no limit. UNCHANGED, in a change only: as the GPU has it."""

    memory: Limit = None
    compute: Limit = None
    burst: Limit = None
    oversubscribe: bool | Unchanged = False

    def __post_init__(self) -> None:
        for name, low, high in (
            ("memory", 1, _SIZE_MAX),
            ("compute", 1, WHOLE_GPU - 1),
            ("burst", 1, WHOLE_GPU),
        ):
            value = getattr(self, name)
            if not isinstance(value, int | Unchanged | None) or (
                isinstance(value, int) and not low <= value <= high
            ):
                raise ValueError(f"bad {name} limit {value!r}: expected {low} to {high}")

    @classmethod
    def change(
        cls,
        *,
        memory: Limit = UNCHANGED,
        compute: Limit = UNCHANGED,
        burst: Limit = UNCHANGED,
        oversubscribe: bool | Unchanged = UNCHANGED,
    ) -> GpuLimits:
        """A change of the limits given; the others UNCHANGED."""
        return cls(memory, compute, burst, oversubscribe)

    def over(self, present: GpuLimits) -> GpuLimits:
        """This change made to a GPU's ``present`` limits (NO_LIMITS for a GPU new to the
        pod): the one place a change and what is there are merged. A burst left as it was
        goes with the compute limit, and oversubscription with the memory limit; ValueError
        (one line) for a burst given without a compute limit or below it, and for
        oversubscription given without a memory limit (it serves what is past the limit)."""
        merged = GpuLimits(
            *(
                getattr(present if getattr(self, f.name) is UNCHANGED else self, f.name)
                for f in dataclasses.fields(self)
            )
        )
        if merged.oversubscribe is True and merged.memory is None:
            if self.oversubscribe is UNCHANGED:
                merged = dataclasses.replace(merged, oversubscribe=False)
            else:
                raise ValueError("oversubscribe needs a memory limit")
        burst, compute = merged.burst, merged.compute
        if burst is None or burst is UNCHANGED or compute is UNCHANGED:
            return merged
        if compute is None:
            if self.burst is UNCHANGED:
                return dataclasses.replace(merged, burst=None)
            raise ValueError(f"burst {_shown(burst)} needs a compute limit")
        if burst < compute:
            raise ValueError(f"burst {_shown(burst)} is below the compute limit {_shown(compute)}")
        return merged

    def __str__(self) -> str:
        """The limits in words, for logs: "memory=4 GiB compute=30 % burst=none ..."; a change
        names only what it changes."""
        return " ".join(
            f"{f.name}={_shown(getattr(self, f.name), f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not UNCHANGED
        )


NO_LIMITS: Final = GpuLimits()


def known(value: Limit) -> int | None:
    """A limit of complete limits (resolved, or merged with ``over``): never UNCHANGED."""
    if isinstance(value, Unchanged):
        raise ValueError("a limit left unchanged has no value of its own")
    return value


def _shown(value: object, name: str = "compute") -> str:
    if value is UNCHANGED or value is None:
        return "unchanged" if value is UNCHANGED else NONE_WORD
    if isinstance(value, bool):
        return "on" if value else "off"
    assert isinstance(value, int)
    return format_size(value) if name == "memory" else format_percent(hundredths_to_percent(value))


# The values of a request (the CLI's flags, the API's fields): a limit, or "none" for no limit.


def _none(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() == NONE_WORD


def parse_memory_limit(value: object) -> int | None:
    """Bytes (a number, or a size such as "4GiB"); None for "none" or 0."""
    zero = value == 0 and not isinstance(value, bool)
    if _none(value) or zero or (isinstance(value, str) and value.strip() == "0"):
        return None
    return parse_size(value)


def parse_compute_limit(value: object) -> int | None:
    """Hundredths of a percent (a percent, 0.01 to 100); None for "none" or 100 (the whole
    GPU is no limit)."""
    if _none(value):
        return None
    hundredths = parse_percent(value)
    return None if hundredths == WHOLE_GPU else hundredths


def parse_burst_limit(value: object) -> int | None:
    """Hundredths of a percent (a percent, 0.01 to 100: 100 is all idle time); None for
    "none"."""
    return None if _none(value) else parse_percent(value)
