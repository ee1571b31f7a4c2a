"""The limiter's configuration, through the library's own parser (vgpu_limiter.config calls the
exported vgpu_limiter_describe_config), and tf-limiter check-config.

The library reads the C environment; os.environ assignments reach it (putenv), so most tests
run in this process inside `configured`, which leaves no limiter variable behind.
"""

import ctypes.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu_common.limits import format_size, parse_percent
from vgpu_common.limits import parse_size as python_parse_size  # the one Python parser
from vgpu_common.paths import DEFAULT_BASE
from vgpu_hypervisor.settings import Settings
from vgpu_limiter.config import (
    ConfigError,
    DeviceSetting,
    LimiterConfig,
    default_base,
    describe_json,
    environment_names,
    load_config,
)
from vgpu_limiter.region import check_name

from tests.limiter.conftest import WORKLOAD, LimitedEnv, run

MEM = "TENSOR_FUSION_CUDA_MEM_LIMIT"
UP = "TENSOR_FUSION_CUDA_UP_LIMIT"
GIB = 1 << 30
MIB = 1 << 20
UUID = "GPU-abcdef01-2345-6789-abcd-ef0123456789"
UINT64_MAX = (1 << 64) - 1


@contextmanager
def configured(values: Mapping[str, str]) -> Iterator[None]:
    """Exactly `values` among the variables the limiter reads, for the duration."""
    saved = {name: os.environ[name] for name in environment_names()}
    for name in saved:
        del os.environ[name]
    os.environ.update(values)
    try:
        yield
    finally:
        for name in environment_names():
            del os.environ[name]
        os.environ.update(saved)


def config_of(values: Mapping[str, str]) -> LimiterConfig:
    with configured(values):
        return load_config()


def error_of(values: Mapping[str, str]) -> str:
    with configured(values), pytest.raises(ConfigError) as raised:
        load_config()
    message = str(raised.value)
    assert "\n" not in message
    return message


def by_key(config: LimiterConfig) -> dict[str, DeviceSetting]:
    return {device.key: device for device in config.devices}


# --- valid configurations ---------------------------------------------------------------------


def test_nothing_set_means_no_limits_and_a_private_region() -> None:
    config = config_of({})
    assert config.devices == ()
    assert config.pod.source == "private"
    assert config.pod.folder is None
    assert config.log.level == "warn"
    assert config.log.path is None


def test_empty_values_are_unset() -> None:
    empty = {name: "" for name in (MEM, UP, "CUDA_DEVICE_MEMORY_LIMIT", "SHM_PATH")}
    assert config_of(empty | {"TF_LOG_LEVEL": ""}).devices == ()


def test_the_issue_example() -> None:
    (device,) = config_of({MEM: '{"0":"4GiB"}'}).devices
    assert device == DeviceSetting(
        key="0",
        kind="index",
        index=0,
        uuid=None,
        memory_limit=4 * GIB,
        memory_source=MEM,
        compute_limit=None,
        compute_source=None,
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"4GiB"', 4 * GIB),
        ('"512MiB"', 512 * MIB),
        ('"4g"', 4 * GIB),
        ('"1024m"', GIB),
        ('"1.5 GiB"', 3 * GIB // 2),
        ('"2KB"', 2000),
        ('"7"', 7),
        ("4294967296", 4 * GIB),
        ("18446744073709551615", UINT64_MAX),
    ],
)
def test_memory_values(value: str, expected: int) -> None:
    (device,) = config_of({MEM: f'{{"1": {value}}}'}).devices
    assert (device.index, device.memory_limit) == (1, expected)


def test_uuid_keys_match_any_case_and_are_kept_lower_case() -> None:
    config = config_of({MEM: f'{{"{UUID.upper()}": "1GiB", "{UUID}": 1073741824}}'})
    (device,) = config.devices
    assert (device.kind, device.key, device.uuid, device.index) == ("uuid", UUID, UUID, None)


@pytest.mark.parametrize(
    ("value", "hundredths"),
    [("50", 5000), ('"12.5%"', 1250), ("100", 10000), ("0.01", 1), ('" 7.10 % "', 710)],
)
def test_compute_values(value: str, hundredths: int) -> None:
    (device,) = config_of({UP: f'{{"0": {value}}}'}).devices
    assert device.compute_limit == hundredths
    assert device.compute_percent == hundredths / 100
    assert device.compute_source == UP


def test_memory_and_compute_for_one_key_are_merged() -> None:
    config = config_of({MEM: '{"0": "2GiB"}', UP: '{"0": 25, "1": 75}'})
    devices = by_key(config)
    assert (devices["0"].memory_limit, devices["0"].compute_limit) == (2 * GIB, 2500)
    assert (devices["1"].memory_limit, devices["1"].compute_limit) == (None, 7500)


def test_hami_variables() -> None:
    config = config_of(
        {
            "CUDA_DEVICE_MEMORY_LIMIT": "4g",
            "CUDA_DEVICE_MEMORY_LIMIT_1": "1024m",
            "CUDA_DEVICE_SM_LIMIT": "30",
            "CUDA_DEVICE_SM_LIMIT_0": "0",
        }
    )
    devices = by_key(config)
    assert (devices["all"].kind, devices["all"].memory_limit) == ("all", 4 * GIB)
    assert devices["all"].compute_limit == 3000
    assert (devices["1"].memory_limit, devices["1"].memory_source) == (
        GIB,
        "CUDA_DEVICE_MEMORY_LIMIT_1",
    )
    # HAMi-core's 0 is "no limit": kept as 100 %, so it overrides the 30 % for device 0.
    assert devices["0"].compute_limit == 10000


def test_the_same_value_twice_is_fine() -> None:
    config = config_of(
        {MEM: '{"0": "2GiB", "0": 2147483648}', "CUDA_DEVICE_MEMORY_LIMIT_0": "2048m"}
    )
    (device,) = config.devices
    assert (device.memory_limit, device.memory_source) == (2 * GIB, MEM)


def test_pod_from_name_and_namespace() -> None:
    pod = config_of({"POD_NAME": "trainer-0"}).pod
    assert (pod.source, pod.namespace, pod.name) == ("POD_NAME", "default", "trainer-0")
    assert pod.folder == Path("/run/tensor-fusion/shm/default/trainer-0")
    assert pod.region_file == Path("/run/tensor-fusion/shm/default/trainer-0/shm")
    values = {"POD_NAME": "p", "POD_NAMESPACE": "team", "SHM_BASE_PATH": "/var/shm/"}
    assert config_of(values).pod.folder == Path("/var/shm/team/p")


def test_shm_path_wins_and_a_namespace_alone_is_no_pod() -> None:
    pod = config_of({"SHM_PATH": "/pods/a/", "POD_NAME": "p"}).pod
    assert (pod.source, pod.folder, pod.name) == ("SHM_PATH", Path("/pods/a"), "p")
    assert config_of({"POD_NAMESPACE": "team"}).pod.source == "private"


def test_log_settings() -> None:
    log = config_of({"TF_LOG_LEVEL": "DEBUG", "TF_LOG_PATH": "/tmp/limiter.log"}).log
    assert (log.level, log.path) == ("debug", Path("/tmp/limiter.log"))
    assert config_of({"TF_LOG_LEVEL": "Warning"}).log.level == "warn"


# --- invalid configurations: one line naming the variable and the value ----------------------

INVALID = [
    ({MEM: '{"0":"4XB"}'}, 'TENSOR_FUSION_CUDA_MEM_LIMIT={"0":"4XB"}: bad size "4XB" for key "0"'),
    ({MEM: '{"0":0}'}, 'bad size 0 for key "0" (a limit of 0 is not allowed)'),
    ({MEM: '{"0":-1}'}, "bad size -1"),
    ({MEM: '{"0":1.5}'}, "bad size 1.5"),
    ({MEM: '{"0":18446744073709551616}'}, "bad size 18446744073709551616"),
    ({MEM: '{"0":"1g",}'}, "trailing comma"),
    ({MEM: '{"0":"1g"} x'}, "unexpected text after the object at offset 11"),
    ({MEM: '{"0":{"a":1}}'}, 'key "0" has a nested object'),
    ({MEM: '{"0":[1]}'}, 'key "0" has a nested array'),
    ({MEM: '["0"]'}, "expected a JSON object"),
    ({MEM: '{"":1}'}, "empty key"),
    ({MEM: '{"gpu0":1}'}, 'bad device key "gpu0"'),
    ({MEM: '{"MIG-abcdef01-2345-6789-abcd-ef0123456789":1}'}, 'bad device key "MIG-'),
    ({MEM: '{"64":1}'}, 'device index "64" is out of range'),
    ({MEM: '{"0":"1g","0":"2g"}'}, 'key "0" is given twice with different values'),
    ({MEM: '{"\\u00e9":1}'}, "only ASCII characters"),
    ({UP: '{"0":0}'}, 'TENSOR_FUSION_CUDA_UP_LIMIT={"0":0}: bad percent 0 for key "0"'),
    ({UP: '{"0":101}'}, "bad percent 101"),
    ({UP: '{"0":12.345}'}, "bad percent 12.345"),
    ({"CUDA_DEVICE_MEMORY_LIMIT": "4x"}, "CUDA_DEVICE_MEMORY_LIMIT=4x: bad size"),
    ({"CUDA_DEVICE_MEMORY_LIMIT_64": "1g"}, '"64" is not a device index 0-63'),
    ({"CUDA_DEVICE_SM_LIMIT_0": "150"}, "CUDA_DEVICE_SM_LIMIT_0=150: bad percent"),
    (
        {MEM: '{"0":"2GiB"}', "CUDA_DEVICE_MEMORY_LIMIT_0": "1g"},
        "CUDA_DEVICE_MEMORY_LIMIT_0=1g: device 0 memory limit 1073741824 bytes contradicts "
        "2147483648 bytes from TENSOR_FUSION_CUDA_MEM_LIMIT",
    ),
    (
        {UP: '{"3":40}', "CUDA_DEVICE_SM_LIMIT_3": "41"},
        "device 3 compute limit 41.00% contradicts 40.00% from TENSOR_FUSION_CUDA_UP_LIMIT",
    ),
    ({"SHM_PATH": "pods/a"}, "SHM_PATH=pods/a: must be an absolute path"),
    ({"POD_NAME": "a/b"}, "POD_NAME=a/b: not a valid name (1-253 letters, digits, '.', '_' or"),
    ({"POD_NAME": ".."}, "POD_NAME=..: not a valid name"),
    ({"POD_NAME": "-rf"}, "POD_NAME=-rf: not a valid name"),
    ({"POD_NAME": ".hidden"}, "POD_NAME=.hidden: not a valid name"),
    ({"POD_NAME": "café"}, "POD_NAME=caf\\xc3\\xa9: not a valid name"),
    ({"POD_NAME": "p" * 254}, "...: not a valid name"),
    ({"POD_NAME": "p", "POD_NAMESPACE": ""}, "POD_NAMESPACE=: not a valid name"),
    ({"POD_NAME": "p", "POD_NAMESPACE": ".devices"}, "POD_NAMESPACE=.devices: not a valid name"),
    ({"CONTAINER_NAME": "-x"}, "CONTAINER_NAME=-x: not a valid name"),
    ({"SHM_BASE_PATH": "shm"}, "SHM_BASE_PATH=shm: must be an absolute path"),
    ({"TF_CUDA_CONTEXT_OVERHEAD": "big"}, "TF_CUDA_CONTEXT_OVERHEAD=big: not a size"),
    ({"TF_CUDA_LIB_PATH": "/" + "l" * 5000}, "TF_CUDA_LIB_PATH=/lll"),
    ({MEM: '{"0":"4.0000001GiB"}'}, 'bad size "4.0000001GiB" for key "0"'),
    ({"POD_NAME": "p", "SHM_BASE_PATH": "shm"}, "SHM_BASE_PATH=shm: must be an absolute path"),
    ({"TF_LOG_LEVEL": "verbose"}, "TF_LOG_LEVEL=verbose: unknown level"),
]


@pytest.mark.parametrize(("values", "expected"), INVALID)
def test_invalid(values: dict[str, str], expected: str) -> None:
    message = error_of(values)
    assert expected in message
    assert message.isascii()
    assert message.isprintable()


def test_long_and_odd_values_stay_one_short_line() -> None:
    message = error_of({MEM: "{" + '"0":"1g",' * 5000 + "\n\x01\u00e9"})
    assert message.startswith(f'{MEM}={{"0":"1g","0":"1g"')
    assert "..." in message
    assert len(message) < 1024
    assert error_of({MEM: '{"0":"4\\nX\\u0001"}'}).startswith(f'{MEM}={{"0":"4\\nX\\u0001"}}: ')


# --- properties ---------------------------------------------------------------------------------

# vgpu_parse_size's units (case-insensitive): binary k/ki/kib..., decimal kb/mb/gb/tb.
UNITS = {
    "": 1,
    "b": 1,
    **{f"{p}{s}": 1 << (10 * n) for n, p in enumerate("kmgt", 1) for s in ("", "i", "ib")},
    **{f"{p}b": 1000**n for n, p in enumerate("kmgt", 1)},
}


def spell_case(text: str, flips: list[bool]) -> str:
    """`text` with the letters whose flip is set in upper case."""
    return "".join(c.upper() if i < len(flips) and flips[i] else c for i, c in enumerate(text))


@st.composite
def sizes(draw: st.DrawFn) -> tuple[str, int]:
    """(JSON value text, bytes): a number of bytes or a string with a unit in some spelling."""
    if draw(st.booleans()):
        number = draw(st.integers(1, UINT64_MAX))
        return str(number), number
    unit = draw(st.sampled_from(sorted(UNITS)))
    factor = UNITS[unit]
    whole = draw(st.integers(0, 1 << 20))
    decimals = draw(st.text("0123456789", max_size=3))
    if factor * int(decimals or "0") % 10 ** len(decimals):
        decimals = ""  # not a whole number of bytes: refused (test_size_grammar)
    expected = whole * factor + factor * int(decimals or "0") // 10 ** len(decimals)
    text = str(whole) + (f".{decimals}" if decimals else "")
    text += draw(st.sampled_from(["", " "])) + spell_case(unit, draw(st.lists(st.booleans())))
    if expected == 0:
        text, expected = "1", 1
    return json.dumps(text), expected


@st.composite
def percents(draw: st.DrawFn) -> tuple[str, int]:
    """(JSON value text, hundredths of a percent)."""
    hundredths = draw(st.integers(1, 10000))
    text = str(hundredths // 100)
    if hundredths % 100 or draw(st.booleans()):
        text += f".{hundredths % 100:02d}"
        if draw(st.booleans()):
            text = text.rstrip("0").rstrip(".")
    if draw(st.booleans()):
        return text, hundredths
    return json.dumps(text + draw(st.sampled_from(["", "%", " %"]))), hundredths


uuids = st.uuids().map(lambda value: f"GPU-{value}")
keys = st.one_of(st.integers(0, 63).map(str), uuids)


@st.composite
def json_object(draw: st.DrawFn, values: dict[str, str]) -> str:
    """Keys spelled in any case (UUIDs), random blanks; the value texts as they are."""
    blank = st.sampled_from(["", " ", "\n", "\t "])
    members = [
        f"{draw(blank)}{json.dumps(key.upper() if draw(st.booleans()) else key)}{draw(blank)}:"
        f"{draw(blank)}{value}{draw(blank)}"
        for key, value in values.items()
    ]
    return draw(blank) + "{" + ",".join(members) + "}" + draw(blank)


@settings(max_examples=300)
@given(st.data(), st.dictionaries(keys, sizes(), max_size=12))
def test_generated_memory_objects_parse_to_their_bytes(
    data: st.DataObject, limits: dict[str, tuple[str, int]]
) -> None:
    text = data.draw(json_object({key: value for key, (value, _) in limits.items()}))
    config = config_of({MEM: text})
    assert {d.key: d.memory_limit for d in config.devices} == {
        key: expected for key, (_, expected) in limits.items()
    }
    assert all(d.memory_source == MEM and d.compute_limit is None for d in config.devices)


@settings(max_examples=300)
@given(st.data(), st.dictionaries(keys, percents(), max_size=12))
def test_generated_compute_objects_parse_to_their_percent(
    data: st.DataObject, limits: dict[str, tuple[str, int]]
) -> None:
    text = data.draw(json_object({key: value for key, (value, _) in limits.items()}))
    config = config_of({UP: text})
    assert {d.key: d.compute_limit for d in config.devices} == {
        key: expected for key, (_, expected) in limits.items()
    }


@given(
    st.integers(1, 1 << 30),
    st.dictionaries(st.integers(0, 63), st.tuples(st.integers(1, 1 << 20), st.sampled_from("kmg"))),
)
def test_generated_hami_variables(all_devices: int, per_index: dict[int, tuple[int, str]]) -> None:
    values = {"CUDA_DEVICE_MEMORY_LIMIT": f"{all_devices}m"}
    values |= {f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{n}{unit}" for i, (n, unit) in per_index.items()}
    devices = by_key(config_of(values))
    assert devices.pop("all").memory_limit == all_devices * MIB
    factor = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    assert {int(key): d.memory_limit for key, d in devices.items()} == {
        i: n * factor[unit] for i, (n, unit) in per_index.items()
    }


VARIABLES = [
    MEM,
    UP,
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_SM_LIMIT_7",
    "SHM_PATH",
    "POD_NAME",
    "TF_LOG_LEVEL",
]
# Environment values cannot hold NUL or lone surrogates.
any_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
PIECES = ["{", "}", "[", "]", ",", ":", '"', "\\", '"0"', '"63"', f'"{UUID}"', '"4GiB"', "1.5"]
PIECES += ["-", "e", "100", "18446744073709551616", " ", "\n", "\\u00", "\\u0041", "é", "%", "null"]
json_like = st.lists(st.sampled_from(PIECES), max_size=24).map("".join)


@settings(max_examples=500)
@given(st.sampled_from(VARIABLES), st.one_of(any_text, json_like, json_like.map("{{{}}}".format)))
def test_any_text_gives_a_configuration_or_one_line_naming_the_variable(
    name: str, text: str
) -> None:
    with configured({name: text}):
        document = json.loads(describe_json())
    if not document["ok"]:
        message = document["error"]
        assert message.startswith(f"{name}=")
        assert message.isascii()
        assert message.isprintable()


# --- tf-limiter check-config ---------------------------------------------------------------------

TF_LIMITER = Path(sys.executable).with_name("tf-limiter")
CLEAN = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def check_config(*args: str, **values: str) -> subprocess.CompletedProcess[str]:
    """check-config in a fresh process, as its module (tf-limiter registers the same function)."""
    return subprocess.run(
        [sys.executable, "-m", "vgpu_limiter.config_cli", *args],
        env=CLEAN | values,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_check_config_table() -> None:
    result = check_config(
        TENSOR_FUSION_CUDA_MEM_LIMIT=f'{{"0":"4GiB","{UUID.upper()}":"1.5GiB"}}',
        TENSOR_FUSION_CUDA_UP_LIMIT='{"0":12.5}',
        CUDA_DEVICE_SM_LIMIT="100",
        POD_NAME="trainer",
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    row = next(line for line in lines if "index 0" in line).split()
    assert row == ["index", "0", "memory", "4", "GiB", "4294967296", MEM]
    row = next(line for line in lines if UUID in line).split()
    assert row == [UUID, "memory", "1.50", "GiB", "1610612736", MEM]
    assert any(line.split() == ["compute", "12.5", "%", UP] for line in lines)
    assert "100 % (no limit)" in result.stdout
    rows = [line.split() for line in lines]
    assert ["pod", "folder", "/run/tensor-fusion/shm/default/trainer", "POD_NAME"] in rows
    assert ["log", "level", "warn", "default"] in rows
    assert ["log", "stderr", "default"] in rows


def test_check_config_without_anything() -> None:
    result = check_config()
    assert result.returncode == 0, result.stderr
    assert "Limits: none" in result.stdout
    assert "private region" in result.stdout


def test_check_config_json() -> None:
    result = check_config("--json", TENSOR_FUSION_CUDA_MEM_LIMIT='{"1":"2g"}', SHM_PATH="/pods/a")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["ok"] is True
    assert document["devices"][0]["memory_limit"] == 2 * GIB
    assert document["pod"] == {
        "source": "SHM_PATH",
        "folder": "/pods/a",
        "region_file": "/pods/a/shm",
        "namespace": None,
        "name": None,
        "name_source": None,
        "uid": None,
        "container": None,
        "container_source": None,
        "base": "/run/tensor-fusion/shm",
        "base_source": "default",
        "region_required": False,
    }
    assert document["process"] == {
        "context_overhead": 544 * MIB,
        "context_overhead_source": "default",
        "cuda_library": "libcuda.so.1",
        "cuda_library_source": "default",
        "nvml_library": "libnvidia-ml.so.1",
        "nvml_library_source": "default",
        "tmp_folder": "/tmp",
        "tmp_source": "default",
    }
    assert document["warnings"] == []


@pytest.mark.parametrize("args", [(), ("--json",)])
def test_check_config_invalid_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    result = check_config(*args, TENSOR_FUSION_CUDA_MEM_LIMIT='{"0":"4XB"}')
    assert result.returncode == 2
    assert result.stderr.startswith(
        'error: TENSOR_FUSION_CUDA_MEM_LIMIT={"0":"4XB"}: bad size "4XB" for key "0"'
    )
    assert result.stderr.count("\n") == 1
    if args:
        assert json.loads(result.stdout)["ok"] is False
    else:
        assert result.stdout == ""


def test_tf_limiter_check_config_entry_point() -> None:
    registered = subprocess.run(
        [TF_LIMITER, "check-config", "--help"], env=CLEAN, capture_output=True, check=False
    )
    if registered.returncode != 0:
        pytest.skip("check-config is not registered in tf-limiter yet")
    result = subprocess.run(
        [TF_LIMITER, "check-config"],
        env=CLEAN | {"TF_LOG_LEVEL": "loud"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stderr) == (
        2,
        "error: TF_LOG_LEVEL=loud: unknown level (error, warn, info or debug)\n",
    )


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (4 * GIB, "4 GiB"), (3 * GIB // 2, "1.50 GiB")],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


def test_format_size_largest() -> None:
    assert format_size(UINT64_MAX) == "16.00 EiB"


# --- every variable through the library, with its source -----------------------------------------

PROCESS_SETTINGS = [
    # (variable, value, setting row as check-config prints it, JSON field, JSON value)
    (
        "TF_CUDA_CONTEXT_OVERHEAD",
        "256MiB",
        "context overhead 256 MiB",
        "context_overhead",
        256 * MIB,
    ),
    (
        "TF_CUDA_LIB_PATH",
        "/opt/libcuda.so.1",
        "CUDA driver /opt/libcuda.so.1",
        "cuda_library",
        "/opt/libcuda.so.1",
    ),
    (
        "TF_NVML_LIB_PATH",
        "/opt/libnvml.so",
        "NVML /opt/libnvml.so",
        "nvml_library",
        "/opt/libnvml.so",
    ),
    ("TMPDIR", "/scratch", "temporary folder /scratch", "tmp_folder", "/scratch"),
]


@pytest.mark.parametrize(("variable", "value", "row", "field", "expected"), PROCESS_SETTINGS)
def test_check_config_shows_each_process_variable_and_its_source(
    variable: str, value: str, row: str, field: str, expected: object
) -> None:
    shown = check_config(**{variable: value})
    assert shown.returncode == 0, shown.stderr
    assert any(line.split() == [*row.split(), variable] for line in shown.stdout.splitlines())
    document = json.loads(check_config("--json", **{variable: value}).stdout)
    assert document["process"][field] == expected
    source = "tmp_source" if field == "tmp_folder" else f"{field}_source"
    assert document["process"][source] == variable


def test_check_config_shows_the_pod_base_and_container() -> None:
    shown = check_config(SHM_BASE_PATH="/srv/shm/", POD_NAME="p", CONTAINER_NAME="main")
    rows = [line.split() for line in shown.stdout.splitlines()]
    assert ["base", "folder", "/srv/shm", "SHM_BASE_PATH"] in rows
    assert ["container", "main", "CONTAINER_NAME"] in rows
    assert ["pod", "default/p", "POD_NAMESPACE,", "POD_NAME"] in rows


def test_the_default_base_is_the_librarys() -> None:
    assert default_base() == Path("/run/tensor-fusion/shm")
    # The Python places that still spell it must stay equal until they read default_base().
    assert default_base() == DEFAULT_BASE
    assert Settings.model_fields["shm_base_path"].default == default_base()


# --- warnings: nothing ignored without a word ----------------------------------------------------

FOREIGN = [
    ("HYPERVISOR_IP", "10.0.0.1", "vgpu.rs", "not over HTTP"),
    ("HYPERVISOR_PORT", "8000", "vgpu.rs", "not over HTTP"),
    ("ENABLE_NVML_HOOKS", "false", "vgpu.rs", "the NVML view follows the memory limit"),
    ("ENABLE_CUDA_HOOKS", "false", "vgpu.rs", "LD_PRELOAD without libcuda_limiter.so"),
    ("TF_SKIP_HOOKS_IF_NO_LIMIT", "true", "vgpu.rs", "already passed through"),
    ("TF_VISIBLE_DEVICES", UUID, "vgpu.rs", "CUDA_VISIBLE_DEVICES"),
]


@pytest.mark.parametrize(("variable", "value", "system", "instead"), FOREIGN)
def test_other_systems_variables_are_one_warning_each(
    variable: str, value: str, system: str, instead: str
) -> None:
    config = config_of({variable: value})
    assert config.devices == ()
    (warning,) = config.warnings
    assert warning.startswith(f"{variable}={value}: {system}'s variable, not supported: ignored")
    assert instead in warning
    shown = check_config(**{variable: value})
    assert shown.returncode == 0
    assert f"Warning: {warning}" in shown.stdout


def test_a_name_that_only_starts_like_another_systems_is_not_one() -> None:
    assert config_of({"CUDA_MEM_LIMITS": "4g", "CUDA_CORE_LIMITED": "1"}).warnings == ()


def test_an_index_key_hidden_by_cuda_visible_devices_is_a_warning() -> None:
    config = config_of({MEM: '{"0": "1g", "1": "1g"}', "CUDA_VISIBLE_DEVICES": "GPU-x"})
    (warning,) = config.warnings
    assert warning == (
        f"{MEM}: device index 1 is not among the 1 device this process sees "
        "(CUDA_VISIBLE_DEVICES=GPU-x): its limit applies to no GPU (a UUID key names a GPU "
        "wherever it is)"
    )


def test_an_index_key_past_the_driver_devices_is_a_warning_in_the_log(
    limited_env: LimitedEnv,
) -> None:
    environment = limited_env('{"0": "1GiB", "7": "1GiB"}')
    result = run([WORKLOAD, "--kernels", "1"], environment)
    assert result.returncode == 0, result.stderr
    assert "device index 7 is not among the" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_uuid_key_not_on_the_node_is_a_warning_in_the_log(limited_env: LimitedEnv) -> None:
    absent = "GPU-12345678-1111-2222-3333-444444444444"
    result = run([WORKLOAD, "--kernels", "1"], limited_env(f'{{"{absent}": "1GiB"}}'))
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert f"{MEM}: {absent} is not on this node (none of its " in line


def test_a_pod_the_daemon_does_not_manage_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "team" / "trainer").mkdir(parents=True)
    values = {"SHM_BASE_PATH": str(tmp_path), "POD_NAMESPACE": "team"}
    assert config_of(values | {"POD_NAME": "trainer"}).warnings == ()
    (warning,) = config_of(values | {"POD_NAME": "trainr"}).warnings
    assert warning.startswith("POD_NAME=trainr: no pod team/trainr on this node (no folder /")
    assert warning.endswith(
        "): not one the daemon manages, so only this environment's limits apply (a typo?)"
    )


def test_an_env_limit_that_differs_from_the_region_is_a_warning(limited_env: LimitedEnv) -> None:
    first = run([WORKLOAD, "--kernels", "1"], limited_env('{"0": "2GiB"}'))
    assert first.returncode == 0, first.stderr
    second = run([WORKLOAD, "--kernels", "1"], limited_env('{"0": "3GiB"}'))
    assert second.returncode == 0, second.stderr
    assert f"{MEM}: memory limit 3221225472 bytes for GPU-" in second.stderr
    assert "differs from the pod region's 2147483648 bytes; the region's applies" in second.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")
def test_the_context_overhead_cannot_be_lowered_in_another_users_region(tmp_path: Path) -> None:
    region = tmp_path / "shm"
    region.write_bytes(b"")
    values = {"SHM_PATH": str(tmp_path), "TF_CUDA_CONTEXT_OVERHEAD": "0"}
    assert config_of(values).process.context_overhead == 0
    os.chown(region, 65534, 65534)
    config = config_of(values)
    assert config.process.context_overhead == 544 * MIB
    assert config.process.context_overhead_source == "default"
    (warning,) = config.warnings
    assert warning.startswith("TF_CUDA_CONTEXT_OVERHEAD=0: ignored: below the default")
    assert config_of(values | {"TF_CUDA_CONTEXT_OVERHEAD": "1GiB"}).process.context_overhead == GIB


# --- one grammar of sizes and one name rule in C and Python --------------------------------------

PARSE_C = Path(__file__).parents[2] / "packages/limiter/csrc/common/vgpu_parse.c"


CSRC = PARSE_C.parents[1]


def c_alone(factory: pytest.TempPathFactory, source: Path, declarations: str) -> Any:
    """One C file of the limiter alone, as a small shared object loaded with cffi: bound
    lazily, since its other functions may call into files not built with it."""
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    library = factory.mktemp(source.stem) / f"lib{source.stem}.so"
    includes = [f"-I{CSRC / folder}" for folder in ("include", "limiter", "common")]
    flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", *includes]
    subprocess.run([compiler, *flags, "-o", str(library), str(source)], check=True)
    from cffi import FFI

    ffi = FFI()
    ffi.cdef(declarations)
    return ffi, ffi.dlopen(str(library), os.RTLD_LAZY)


@pytest.fixture(scope="module")
def c_parse(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """vgpu_parse.c: sizes and names."""
    return c_alone(
        tmp_path_factory,
        PARSE_C,
        "bool vgpu_parse_size(const char *text, uint64_t *bytes);"
        "bool vgpu_valid_name(const char *text);",
    )


def c_size(c_parse: Any, text: str) -> int | None:
    """The C parser's bytes, or None where it refuses; 0 is refused as Python does (every size
    that is a limit or a setting must be > 0)."""
    ffi, lib = c_parse
    out = ffi.new("uint64_t *")
    if not lib.vgpu_parse_size(text.encode(), out) or out[0] == 0:
        return None
    return int(out[0])


def py_size(text: str) -> int | None:
    try:
        return python_parse_size(text)
    except ValueError:
        return None


# Sizes as people write them, pieces that probe the edges, and ASCII text of any kind.
SIZE_UNITS = [
    "",
    "b",
    "B",
    "k",
    "Ki",
    "KiB",
    "kb",
    "KB",
    "m",
    "MiB",
    "MB",
    "g",
    "Gi",
    "GiB",
    "GB",
    "t",
    "TiB",
    "TB",
    "x",
    "gib b",
    "i",
    "PiB",
]
BLANKS = st.sampled_from(["", " ", "\t", "\n", "\r", "\f", "\v", "  "])
NUMBERS = st.one_of(
    st.integers(0, 10**25).map(str),
    st.tuples(st.integers(0, 10**6), st.text("0123456789", min_size=0, max_size=40)).map(
        lambda pair: f"{pair[0]}.{pair[1]}"
    ),
    st.decimals(0, 10**7, allow_nan=False, allow_infinity=False).map(str),
    st.sampled_from(
        [
            "4.0000001",
            "0.5",
            "1.5",
            "0.25",
            ".5",
            "5.",
            "00012",
            "18446744073709551615",
            "18446744073709551616",
            "16777215.999999940395355224609375",
            "-1",
            "+1",
        ]
    ),
)
written_sizes = st.tuples(BLANKS, NUMBERS, BLANKS, st.sampled_from(SIZE_UNITS), BLANKS).map("".join)
# ASCII without NUL (an environment value cannot hold it) and without \x1c-\x1f, which
# Python's str.isspace calls white space (see test_python_sizes_refused_as_in_c).
ascii_text = st.text(
    st.characters(min_codepoint=1, max_codepoint=127, exclude_characters="\x1c\x1d\x1e\x1f")
)


_GRAMMAR = re.compile(
    r"[ \t\n\r\f\v]*([0-9]+(?:\.[0-9]+)?)[ \t\n\r\f\v]*([a-z]*)[ \t\n\r\f\v]*", re.I | re.A
)


def grammar_size(text: str) -> int | None:
    """The grammar of vgpu_parse.h, exactly (Fraction): ASCII blanks, digits with an optional
    fraction, a unit; a whole number of bytes, 1 to 2**64 - 1."""
    match = _GRAMMAR.fullmatch(text)
    factor = UNITS.get(match[2].lower()) if match else None
    if match is None or factor is None:
        return None
    exact = Fraction(match[1]) * factor
    if exact.denominator != 1 or not 0 < exact <= UINT64_MAX:
        return None
    return int(exact)


@settings(max_examples=1500)
@given(st.one_of(written_sizes, ascii_text))
def test_the_c_and_python_size_parsers_agree(c_parse: Any, text: str) -> None:
    expected = grammar_size(text)
    assert c_size(c_parse, text) == expected, text
    assert py_size(text) == expected, text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GiB", 4 * GIB),
        ("1.5KiB", 1536),
        ("1.5KB", 1500),
        ("0.25k", 256),
        (" 4 g\n", 4 * GIB),
        ("1.0000000000000000000000000g", GIB),
        ("16777215.999999940395355224609375TiB", UINT64_MAX - (1 << 16) + 1),
        ("4.0000001GiB", None),  # 4294967296.43 bytes: not a whole number, refused
        ("0.1KiB", None),
        ("0.5", None),
        (".5g", None),
        ("5.g", None),
        ("0", None),
        ("18446744073709551616", None),
        # Any number of digits (Python's int() refused past 4300, in words of its own):
        ("0" * 5000 + "5", 5),
        ("1." + "0" * 5000 + "GiB", GIB),
        ("9" * 5000, None),
        ("0." + "0" * 5000 + "5KiB", None),
    ],
)
def test_size_grammar(c_parse: Any, text: str, expected: int | None) -> None:
    assert c_size(c_parse, text) == expected
    assert py_size(text) == expected


@pytest.fixture(scope="module")
def c_percent(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """config_values.c: the limiter's percents."""
    return c_alone(
        tmp_path_factory,
        CSRC / "limiter/config_values.c",
        "bool vgpu_config_parse_percent(const char *text, bool allow_sign, uint32_t *out);",
    )


written_percents = st.tuples(
    st.sampled_from(["", " ", "\t", "\n"]),
    st.one_of(
        st.integers(0, 1000).map(str),
        st.tuples(st.integers(0, 120), st.text("0123456789", max_size=4)).map(
            lambda pair: f"{pair[0]}.{pair[1]}"
        ),
        st.sampled_from(["0100", ".5", "5.", "1e2", "-1", "+1", "50.001", "99.990"]),
    ),
    st.sampled_from(["", " ", "%", " % ", "%%", "\t"]),
).map("".join)


@settings(max_examples=800)
@given(st.one_of(written_percents, ascii_text))
def test_the_c_and_python_percent_parsers_agree(c_percent: Any, text: str) -> None:
    """What the limiter reads in TENSOR_FUSION_CUDA_UP_LIMIT is what the CLI, the API and the
    annotations read: the same hundredths, refused alike (range 0.01 to 100)."""
    ffi, lib = c_percent
    out = ffi.new("uint32_t *")
    in_c = lib.vgpu_config_parse_percent(text.encode(), True, out) and 1 <= out[0] <= 10000
    try:
        in_python: int | None = parse_percent(text)
    except ValueError:
        in_python = None
    assert in_python == (int(out[0]) if in_c else None), text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0" * 5000 + "5", 500),
        ("12.5" + "0" * 5000, 1250),
        ("9" * 5000, None),
        ("0." + "0" * 5000 + "1", None),
    ],
)
def test_percents_of_any_number_of_digits_as_in_c(
    c_percent: Any, text: str, expected: int | None
) -> None:
    """Leading zeros and a fraction's trailing zeros change nothing, however many: "0005" is 5
    (Python's int() refused past 4300 digits, in words of its own)."""
    ffi, lib = c_percent
    out = ffi.new("uint32_t *")
    in_c = lib.vgpu_config_parse_percent(text.encode(), True, out) and 1 <= out[0] <= 10000
    assert (int(out[0]) if in_c else None) == expected
    try:
        assert parse_percent(text) == expected
    except ValueError:
        assert expected is None


@pytest.mark.parametrize(
    "text",
    ["18446744073709551616", "0.99999999999999999999999999995", "\x1c4g", "\u20034g", "4\u212a"],
)
def test_python_sizes_refused_as_in_c(c_parse: Any, text: str) -> None:
    assert c_size(c_parse, text) is None
    assert py_size(text) is None


def c_name(c_parse: Any, text: str) -> bool:
    _, lib = c_parse
    return bool(lib.vgpu_valid_name(text.encode("utf-8", "surrogateescape")))


def py_name(text: str) -> bool:
    try:
        check_name("pod name", text)
    except ValueError:
        return False
    return True


NAME_PIECES = ["a", "Z", "0", "_", ".", "-", "-rf", ".hidden", "é", "/", " ", "..", "ß", "\n"]
names = st.one_of(
    st.lists(st.sampled_from(NAME_PIECES), max_size=8).map("".join),
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12),
    st.integers(250, 256).map(lambda length: "n" * length),
    st.text("abc.-_", min_size=1, max_size=300),
)


@settings(max_examples=1500)
@given(names)
def test_the_c_and_python_name_rules_agree(c_parse: Any, text: str) -> None:
    assert c_name(c_parse, text) == py_name(text), repr(text)


def test_a_driver_library_without_cuinit_is_named(limited_env: LimitedEnv) -> None:
    """TF_CUDA_LIB_PATH naming a library that loads but is no CUDA driver: only
    CUDA_ERROR_NOT_INITIALIZED came, with no word why."""
    libc = ctypes.util.find_library("c")
    assert libc is not None
    result = run([WORKLOAD], limited_env(TF_CUDA_LIB_PATH=libc))
    assert result.returncode != 0
    assert f"error: TF_CUDA_LIB_PATH: {libc} has no cuInit: not the CUDA driver" in result.stderr
