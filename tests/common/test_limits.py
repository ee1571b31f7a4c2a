"""The words of a pod's limits (vgpu_common.limits): every parser gives a value in its range or
a ValueError of one line, its formatter's text reads back as the value, and the values the
region header defines too are the header's.

parse_size is held equal to the C parser in tests/limiter/test_config.py, and so is
parse_percent; the readers (CLI, API, annotations) are tested where they are."""

import dataclasses
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu_common.limits import (
    GPU_KEY_PATTERN,
    MAX_WEIGHT,
    NO_LIMITS,
    QOS_NAMES,
    QUANTITY_MAX,
    UNCHANGED,
    WHOLE_GPU,
    GpuLimits,
    Qos,
    format_bytes,
    format_percent,
    format_size,
    hundredths_to_percent,
    names_gpu,
    normalize_uuid,
    parse_burst_limit,
    parse_compute_limit,
    parse_gpu_key,
    parse_memory_limit,
    parse_percent,
    parse_qos,
    parse_quantity,
    parse_size,
    parse_switch,
    qos_of,
)
from vgpu_limiter.region import CONSTANTS, MAX_DEVICES, region_path

UUID = "GPU-00000000-1111-2222-3333-444444444444"
hundredths = st.integers(1, WHOLE_GPU)


def one_line_error(parse: object, value: object) -> str:
    """The ValueError ``parse(value)`` raises: one line, never another exception."""
    assert callable(parse)
    with pytest.raises(ValueError) as raised:
        parse(value)
    message = str(raised.value)
    assert message and "\n" not in message
    return message


# --- the region header's values ---------------------------------------------------------------


def test_the_classes_and_the_whole_gpu_are_the_region_headers() -> None:
    assert {qos.name: int(qos) for qos in Qos} == {
        name.removeprefix("VGPU_QOS_"): value
        for name, value in CONSTANTS.items()
        if name.startswith("VGPU_QOS_")
    }
    assert CONSTANTS["VGPU_COMPUTE_UNLIMITED"] == WHOLE_GPU
    assert [qos.weight for qos in Qos] == [1, 2, 4, 8]
    assert QOS_NAMES == ("low", "medium", "high", "critical")


def test_a_gpu_index_names_every_device_entry_a_region_holds() -> None:
    assert all(parse_gpu_key(str(index)) == str(index) for index in range(MAX_DEVICES))
    region_path("/base", "default", "p")  # the names' rule is the region's, not this module's


# --- sizes ------------------------------------------------------------------------------------


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


@given(st.integers(0, 50), st.sampled_from(range(0, 41, 10)))
def test_an_exact_size_reads_back(count: int, shift: int) -> None:
    size = max(1, count) << shift
    assert parse_size(format_size(size).replace(" ", "")) == size


# --- percents ---------------------------------------------------------------------------------


@given(hundredths, st.sampled_from([" %", "%"]))
def test_a_formatted_percent_reads_back(value: int, unit: str) -> None:
    text = format_percent(hundredths_to_percent(value), unit)
    assert parse_percent(text) == value
    assert parse_percent(hundredths_to_percent(value)) == value  # the JSON number the CLI sends


@pytest.mark.parametrize(
    ("percent", "text"), [(50, "50 %"), (12.5, "12.5 %"), (0.01, "0.01 %"), (33.333, "33.33 %")]
)
def test_format_percent(percent: float, text: str) -> None:
    assert format_percent(percent) == text
    assert format_percent(percent, "%") == text.replace(" ", "")


@given(st.one_of(st.text(max_size=12), st.floats(), st.integers(), st.booleans(), st.none()))
def test_the_percent_parser_is_total_and_in_range(value: object) -> None:
    try:
        parsed = parse_percent(value)
    except ValueError as error:
        assert str(error).startswith("expected a percent from 0.01 to 100") and "\n" not in str(
            error
        )
        return
    assert 1 <= parsed <= WHOLE_GPU
    assert not isinstance(value, bool)


@pytest.mark.parametrize(
    "value",
    ["0", 0, "100.01", 101, "12.345", 12.345, "1e1", "-5", "", "%", "30 %%", True, math.nan, None,
     10**400, -(10**400)],
)  # fmt: skip
def test_percents_out_of_range_or_too_fine_are_refused(value: object) -> None:
    assert "0.01 to 100" in one_line_error(parse_percent, value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("30", 3000), (" 12.5 % ", 1250), ("0.50", 50), ("0.010", 1), (0.5, 50), (12.3, 1230)],
)
def test_percents_as_people_write_them(value: object, expected: int) -> None:
    assert parse_percent(value) == expected


def test_no_limit_is_none_in_every_request_value() -> None:
    assert parse_memory_limit("none") is parse_memory_limit(0) is parse_memory_limit("0") is None
    assert parse_compute_limit("None") is parse_compute_limit(100) is None
    assert parse_burst_limit("none") is None and parse_burst_limit(100) == WHOLE_GPU
    assert parse_memory_limit("4GiB") == 4 << 30 and parse_compute_limit("30") == 3000
    assert "bytes" in one_line_error(parse_memory_limit, "lots")


# --- numbers of any length --------------------------------------------------------------------
# int() refuses more than 4300 digits with a ValueError of its own ("Exceeds the limit (4300
# digits) ... sys.set_int_max_str_digits()"), which the CLI and the API passed on as theirs.

NUMBER_PARSERS = (parse_size, parse_memory_limit, parse_percent, parse_compute_limit)


@given(
    st.sampled_from(NUMBER_PARSERS),
    st.integers(0, 6000),
    st.integers(0, 6000),
    st.integers(0, 6000),
    st.sampled_from(["", "GiB", " %", "kb"]),
)
def test_a_number_of_any_length_is_a_value_or_the_parsers_one_line(
    parse: object, zeros: int, digits: int, decimals: int, unit: str
) -> None:
    text = "0" * zeros + "7" * digits + ("." + "5" * decimals if decimals else "") + unit
    assert callable(parse)
    try:
        parse(text)
    except ValueError:
        message = one_line_error(parse, text)
        assert message.startswith("expected a "), message


@given(st.integers(0, 6000), st.integers(1, 100), st.integers(0, 6000))
def test_leading_zeros_and_trailing_decimal_zeros_change_nothing(
    zeros: int, value: int, trailing: int
) -> None:
    padded = "0" * zeros + str(value)
    decimals = "." + "0" * trailing if trailing else ""
    assert parse_size(padded + decimals) == parse_size(str(value)) == value
    assert parse_memory_limit(padded + decimals + "MiB") == value << 20
    assert parse_percent(padded + decimals) == parse_compute_limit(padded) or value == 100
    assert parse_percent(padded + decimals) == value * 100


@pytest.mark.parametrize(
    "text",
    ["9" * 5000, "1." + "1" * 5000 + "GiB", "0." + "0" * 5000 + "1", "1" * 65 + "b", "1e5000"],
)
def test_an_absurdly_long_number_is_refused_in_the_parsers_words(text: str) -> None:
    for parse in NUMBER_PARSERS:
        message = one_line_error(parse, text)
        assert message.startswith("expected a ") and "digits" not in message


# --- switches, quantities, classes, GPU keys --------------------------------------------------


@given(st.one_of(st.text(max_size=8), st.booleans(), st.integers()))
def test_the_switch_parser_is_total(value: object) -> None:
    try:
        on = parse_switch(value)
    except ValueError:
        assert one_line_error(parse_switch, value) == "expected true or false"
        return
    assert on is (value is True or str(value).strip().lower() in ("true", "yes", "on", "1"))


@given(st.integers(0, QUANTITY_MAX))
def test_a_quantity_reads_back_in_the_forms_the_api_server_writes(count: int) -> None:
    assert parse_quantity(str(count)) == count
    assert parse_quantity(f"{count}000m") == count
    if count % 1000 == 0:
        assert parse_quantity(f"{count // 1000}k") == count
        assert parse_quantity(f"{count // 1000}e3") == count


@given(st.text(max_size=16))
def test_the_quantity_parser_is_total(text: str) -> None:
    try:
        count = parse_quantity(text)
    except ValueError:
        assert one_line_error(parse_quantity, text).startswith("expected a whole number")
        return
    assert 0 <= count <= QUANTITY_MAX


@pytest.mark.parametrize("text", ["0.5", "-1", "2Gi", "1e999", "1k5", "one", "1" * 80])
def test_quantities_that_are_no_count_are_refused(text: str) -> None:
    one_line_error(parse_quantity, text)


@given(st.sampled_from(list(Qos)), st.sampled_from([str.upper, str.title, str.lower]))
def test_a_class_reads_back_in_any_case(qos: Qos, case: object) -> None:
    assert callable(case)
    assert parse_qos(f" {case(qos.label)} ") is qos


def test_classes_and_weights() -> None:
    assert one_line_error(parse_qos, "urgent") == "expected low, medium, high or critical"
    assert qos_of(7) is Qos.MEDIUM and qos_of(3) is Qos.CRITICAL
    assert MAX_WEIGHT == 1_000_000


@given(st.integers(0, 999), st.uuids())
def test_gpu_keys_read_back(index: int, uuid: object) -> None:
    text = f"GPU-{uuid}"
    assert parse_gpu_key(str(index)) == str(index)
    assert parse_gpu_key(text.upper()) == normalize_uuid(text) == text.lower().replace("gpu", "GPU")
    assert names_gpu(str(index), index, None) and names_gpu(text.upper(), None, text)
    assert not names_gpu(str(index), index + 1, text)


@given(st.text(max_size=44))
def test_the_gpu_key_rule_is_total_and_matches_its_pattern(text: str) -> None:
    try:
        key = parse_gpu_key(text)
    except ValueError:
        assert one_line_error(parse_gpu_key, text).startswith(f"bad GPU key {text!r}: ")
        assert not re.fullmatch(GPU_KEY_PATTERN, text)
        return
    assert re.fullmatch(GPU_KEY_PATTERN, text) and re.fullmatch(GPU_KEY_PATTERN, key)


@pytest.mark.parametrize(
    "key", ["GPU-nope", "01", "1000", "-1", "GPU-0000000-1111-2222-3333-44444444444"]
)
def test_bad_gpu_keys_are_named(key: str) -> None:
    assert repr(key) in one_line_error(parse_gpu_key, key)


# --- one GPU's limits -------------------------------------------------------------------------

limits = st.builds(
    GpuLimits,
    memory=st.one_of(st.none(), st.just(UNCHANGED), st.integers(1, 1 << 40)),
    compute=st.one_of(st.none(), st.just(UNCHANGED), st.integers(1, WHOLE_GPU - 1)),
    burst=st.one_of(st.none(), st.just(UNCHANGED), hundredths),
    oversubscribe=st.one_of(st.booleans(), st.just(UNCHANGED)),
)


@given(limits, limits)
def test_a_change_over_what_is_there_is_complete_and_keeps_its_rules(
    change: GpuLimits, present: GpuLimits
) -> None:
    present = dataclasses.replace(present, burst=None, oversubscribe=False).over(NO_LIMITS)
    if isinstance(present.compute, int):  # with a burst that can be: at least the limit
        present = dataclasses.replace(present, burst=present.compute)
    if isinstance(present.memory, int):  # with oversubscription that can be: past a limit
        present = dataclasses.replace(present, oversubscribe=change.memory is None)
    try:
        merged = change.over(present)
    except ValueError as error:
        assert "\n" not in str(error)
        if "oversubscribe" in str(error):  # given, where no memory limit is left
            assert change.oversubscribe is True
            assert change.memory is None or (change.memory is UNCHANGED and not present.memory)
            return
        assert "burst" in str(error)
        # A burst given that cannot be, or the one there now below a compute limit raised.
        compute, burst = change.compute, present.burst
        raised = isinstance(compute, int) and isinstance(burst, int) and compute > burst
        assert change.burst is not UNCHANGED or raised
        return
    assert UNCHANGED not in (merged.memory, merged.compute, merged.burst, merged.oversubscribe)
    for name in ("memory", "compute"):
        given_value = getattr(change, name)
        assert getattr(merged, name) == (
            getattr(present, name) if given_value is UNCHANGED else given_value
        )
    kept = present.oversubscribe if change.oversubscribe is UNCHANGED else change.oversubscribe
    # Oversubscription left as it was goes with the memory limit.
    assert merged.oversubscribe == (kept and merged.memory is not None)
    if isinstance(merged.burst, int):
        assert isinstance(merged.compute, int) and merged.burst >= merged.compute
    assert merged.over(merged) == merged


def test_a_burst_goes_with_the_compute_limit_left_unchanged_but_not_when_given() -> None:
    present = GpuLimits(compute=3000, burst=8000)
    assert GpuLimits.change(compute=None).over(present) == GpuLimits()
    assert "needs a compute limit" in one_line_error(GpuLimits.change(burst=5000).over, NO_LIMITS)
    below = one_line_error(GpuLimits.change(burst=2000).over, present)
    assert below == "burst 20 % is below the compute limit 30 %"


def test_oversubscription_goes_with_the_memory_limit_left_unchanged_but_not_when_given() -> None:
    """It serves what is past the memory limit: without one it cannot take effect."""
    present = GpuLimits(memory=4 << 30, oversubscribe=True)
    assert GpuLimits.change(memory=None).over(present) == GpuLimits()
    given = GpuLimits.change(oversubscribe=True)
    assert one_line_error(given.over, NO_LIMITS) == "oversubscribe needs a memory limit"
    both = GpuLimits.change(memory=None, oversubscribe=True)
    assert one_line_error(both.over, present) == "oversubscribe needs a memory limit"
    assert given.over(GpuLimits(memory=1 << 30)) == GpuLimits(memory=1 << 30, oversubscribe=True)


@pytest.mark.parametrize(
    "fields", [{"memory": 0}, {"compute": WHOLE_GPU}, {"compute": 0}, {"burst": WHOLE_GPU + 1}]
)
def test_limits_out_of_the_regions_range_are_no_limits(fields: dict[str, int]) -> None:
    one_line_error(lambda given: GpuLimits(**given), fields)


def test_limits_in_words() -> None:
    change = GpuLimits.change(memory=4 << 30, compute=1250, burst=None)
    assert str(change) == "memory=4 GiB compute=12.5 % burst=none"
    assert str(GpuLimits.change(oversubscribe=True)) == "oversubscribe=on"
    assert str(GpuLimits()) == "memory=none compute=none burst=none oversubscribe=off"
