"""The shared units (vgpu_common.units): byte formats and compute shares.

parse_size is checked with the settings (test_settings.py), format_size and format_percent
with the limiter's config tables (tests/limiter/test_config.py)."""

import pytest
from vgpu_common.units import (
    WHOLE_GPU,
    format_bytes,
    format_size,
    hundredths_to_percent,
    percent_to_hundredths,
)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536 << 10, "1.5 MiB"),
        (4 << 30, "4.0 GiB"),
        ((1 << 20) - 1, "1024.0 KiB"),
        (1 << 70, "1024.0 EiB"),
    ],
)
def test_format_bytes_has_one_decimal(size: int, text: str) -> None:
    assert format_bytes(size) == text


def test_format_size_is_exact_where_the_unit_divides() -> None:
    assert format_size(64 << 20) == "64 MiB"
    assert format_size(1_500_000_000) == "1.40 GiB"


@pytest.mark.parametrize(
    ("percent", "hundredths"), [(12.5, 1250), (0.01, 1), (30, 3000), (100, WHOLE_GPU)]
)
def test_compute_shares_in_hundredths(percent: float, hundredths: int) -> None:
    assert percent_to_hundredths(percent) == hundredths
    assert hundredths_to_percent(hundredths) == percent
