"""Other systems' variables, read with their meaning: one table per system (every variable, its
units, bad values naming the variable), the order between systems, and tf-limiter check-config.
"""

import json
from pathlib import Path

import pytest

from tests.limiter.test_config import UUID, by_key, check_config, config_of, error_of

GIB = 1 << 30
MIB = 1 << 20
UUID_B = "GPU-00000000-1111-2222-3333-444444444444"
MEM = "TENSOR_FUSION_CUDA_MEM_LIMIT"

# (environment, device key, attribute, value, source)
Expected = tuple[dict[str, str], str, str, object, str]

VGPU_MANAGER: list[Expected] = [
    ({"CUDA_MEM_LIMIT_0": "1000m"}, "0", "memory_limit", 1000 * MIB, "CUDA_MEM_LIMIT_0"),
    ({"CUDA_MEM_LIMIT_1": "4g"}, "1", "memory_limit", 4 * GIB, "CUDA_MEM_LIMIT_1"),
    ({"CUDA_MEM_LIMIT_2": "4G"}, "2", "memory_limit", 4 * GIB, "CUDA_MEM_LIMIT_2"),
    ({"CUDA_MEM_LIMIT_0": "10GB"}, "0", "memory_limit", 10 * GIB, "CUDA_MEM_LIMIT_0"),
    ({"CUDA_MEM_LIMIT_0": "1.5g"}, "0", "memory_limit", 3 * GIB // 2, "CUDA_MEM_LIMIT_0"),
    ({"CUDA_MEM_LIMIT_0": "512k"}, "0", "memory_limit", 512 << 10, "CUDA_MEM_LIMIT_0"),
    ({"CUDA_MEM_LIMIT_0": "1t"}, "0", "memory_limit", 1 << 40, "CUDA_MEM_LIMIT_0"),
    ({"CUDA_MEM_LIMIT_0": "1073741824"}, "0", "memory_limit", GIB, "CUDA_MEM_LIMIT_0"),
    ({"CUDA_MEM_LIMIT": "2g"}, "all", "memory_limit", 2 * GIB, "CUDA_MEM_LIMIT"),
    (
        {"CUDA_MEM_LIMIT_0": "4g", "CUDA_MEM_RATIO_0": "2"},
        "0",
        "memory_limit",
        2 * GIB,
        "CUDA_MEM_LIMIT_0/CUDA_MEM_RATIO_0",
    ),
    (
        {"CUDA_MEM_LIMIT_0": "4g", "CUDA_MEM_RATIO_0": "2"},
        "0",
        "oversubscribe",
        True,
        "CUDA_MEM_RATIO_0",
    ),
    (
        {"CUDA_MEM_LIMIT_1": "3g", "CUDA_MEM_RATIO": "1.5"},
        "1",
        "memory_limit",
        2 * GIB,
        "CUDA_MEM_LIMIT_1/CUDA_MEM_RATIO",
    ),
    (
        {"CUDA_MEM_LIMIT": "3g", "CUDA_MEM_RATIO_1": "3"},
        "1",
        "memory_limit",
        GIB,
        "CUDA_MEM_LIMIT/CUDA_MEM_RATIO_1",
    ),
    ({"CUDA_MEM_LIMIT_0": "4g", "CUDA_MEM_RATIO_0": "1"}, "0", "oversubscribe", None, ""),
    ({"CUDA_CORE_LIMIT": "30"}, "all", "compute_limit", 3000, "CUDA_CORE_LIMIT"),
    ({"CUDA_CORE_LIMIT_1": "25"}, "1", "compute_limit", 2500, "CUDA_CORE_LIMIT_1"),
    ({"CUDA_CORE_LIMIT_1": "0"}, "1", "compute_limit", 10000, "CUDA_CORE_LIMIT_1"),
    (
        {"CUDA_CORE_LIMIT": "30", "CUDA_CORE_SOFT_LIMIT": "60"},
        "all",
        "soft_limit",
        6000,
        "CUDA_CORE_SOFT_LIMIT",
    ),
    (
        {"CUDA_CORE_LIMIT_0": "30", "CUDA_CORE_SOFT_LIMIT_0": "30"},
        "0",
        "soft_limit",
        3000,
        "CUDA_CORE_SOFT_LIMIT_0",
    ),
    ({"CUDA_MEM_OVERSOLD_0": "true"}, "0", "oversubscribe", True, "CUDA_MEM_OVERSOLD_0"),
    ({"CUDA_MEM_OVERSOLD_0": "TRUE"}, "0", "oversubscribe", True, "CUDA_MEM_OVERSOLD_0"),
    ({"CUDA_MEM_OVERSOLD_0": "1"}, "0", "oversubscribe", True, "CUDA_MEM_OVERSOLD_0"),
    ({"CUDA_MEM_OVERSOLD_0": "false"}, "0", "oversubscribe", False, "CUDA_MEM_OVERSOLD_0"),
    ({"CUDA_MEM_OVERSOLD": "true"}, "all", "oversubscribe", True, "CUDA_MEM_OVERSOLD"),
    (
        {"CUDA_MEMORY_OVERSUBSCRIBE": "true"},
        "all",
        "oversubscribe",
        True,
        "CUDA_MEMORY_OVERSUBSCRIBE",
    ),
    # GPU_DEVICES_UUID binds the i of every NAME_<i> to a GPU.
    (
        {"GPU_DEVICES_UUID": f"{UUID}, {UUID_B.upper()}", "CUDA_MEM_LIMIT_1": "2g"},
        UUID_B,
        "memory_limit",
        2 * GIB,
        "CUDA_MEM_LIMIT_1",
    ),
    (
        {"GPU_DEVICES_UUID": UUID, "CUDA_CORE_LIMIT_0": "40"},
        UUID,
        "compute_limit",
        4000,
        "CUDA_CORE_LIMIT_0",
    ),
]

VCUDA_HOOK: list[Expected] = [
    ({"VCUDA_MEMORY_LIMIT": "10737418240"}, "all", "memory_limit", 10 * GIB, "VCUDA_MEMORY_LIMIT"),
    ({"VCUDA_MEMORY_LIMIT": "10g"}, "all", "memory_limit", 10 * GIB, "VCUDA_MEMORY_LIMIT"),
    ({"VCUDA_MEMORY_LIMIT": "512 MB"}, "all", "memory_limit", 512 * MIB, "VCUDA_MEMORY_LIMIT"),
    ({"VCUDA_MEMORY_LIMIT": "2Gi"}, "all", "memory_limit", 2 * GIB, "VCUDA_MEMORY_LIMIT"),
    ({"VCUDA_MEMORY_LIMIT": "4096 bytes"}, "all", "memory_limit", 4096, "VCUDA_MEMORY_LIMIT"),
]

HAMI_CORE: list[Expected] = [
    (
        {"CUDA_DEVICE_MEMORY_LIMIT": "4g"},
        "all",
        "memory_limit",
        4 * GIB,
        "CUDA_DEVICE_MEMORY_LIMIT",
    ),
    (
        {"CUDA_DEVICE_MEMORY_LIMIT_1": "1024m"},
        "1",
        "memory_limit",
        GIB,
        "CUDA_DEVICE_MEMORY_LIMIT_1",
    ),
    ({"CUDA_DEVICE_SM_LIMIT": "20"}, "all", "compute_limit", 2000, "CUDA_DEVICE_SM_LIMIT"),
    (
        {"CUDA_DEVICE_SM_LIMIT": "20", "GPU_CORE_UTILIZATION_POLICY": "FORCE"},
        "all",
        "compute_limit",
        2000,
        "CUDA_DEVICE_SM_LIMIT",
    ),
    (
        {"CUDA_DEVICE_SM_LIMIT": "20", "GPU_CORE_UTILIZATION_POLICY": "default"},
        "all",
        "compute_limit",
        2000,
        "CUDA_DEVICE_SM_LIMIT",
    ),
]

VGPU_RS: list[Expected] = [
    (
        {"TENSOR_FUSION_CUDA_UP_LIMIT": '{"gpu-3430f778-7a25-704c-9090-8b0bb2478114": 10}'},
        "GPU-3430f778-7a25-704c-9090-8b0bb2478114",
        "compute_limit",
        1000,
        "TENSOR_FUSION_CUDA_UP_LIMIT",
    ),
    ({MEM: '{"0": 2147483648}'}, "0", "memory_limit", 2 * GIB, MEM),
]


@pytest.mark.parametrize(
    ("environment", "key", "attribute", "value", "source"),
    [
        pytest.param(*case, id=f"{system}-{index}")
        for system, cases in (
            ("vgpu-manager", VGPU_MANAGER),
            ("vcuda-hook", VCUDA_HOOK),
            ("HAMi-core", HAMI_CORE),
            ("vgpu.rs", VGPU_RS),
        )
        for index, case in enumerate(cases)
    ],
)
def test_each_variable_sets_its_limit(
    environment: dict[str, str], key: str, attribute: str, value: object, source: str
) -> None:
    config = config_of(environment)
    device = by_key(config)[key]
    assert getattr(device, attribute) == value
    source_attribute = {
        "memory_limit": "memory_source",
        "compute_limit": "compute_source",
        "soft_limit": "soft_source",
        "oversubscribe": "oversubscribe_source",
    }[attribute]
    assert (getattr(device, source_attribute) or "") == source
    assert not [w for w in config.warnings if "not supported" in w]


BAD: list[tuple[dict[str, str], str]] = [
    # vgpu-manager
    ({"CUDA_MEM_LIMIT_0": "4x"}, "CUDA_MEM_LIMIT_0=4x: bad size"),
    ({"CUDA_MEM_LIMIT_0": "0"}, "CUDA_MEM_LIMIT_0=0: bad size (a limit of 0 is not allowed)"),
    ({"CUDA_MEM_LIMIT_0": "-1g"}, "CUDA_MEM_LIMIT_0=-1g: bad size"),
    ({"CUDA_MEM_LIMIT": "4gg"}, "CUDA_MEM_LIMIT=4gg: bad size"),
    ({"CUDA_MEM_LIMIT_x": "1g"}, 'CUDA_MEM_LIMIT_x=1g: "x" is not a device index 0-63'),
    ({"CUDA_MEM_LIMIT_64": "1g"}, 'CUDA_MEM_LIMIT_64=1g: "64" is not a device index'),
    (
        {"CUDA_MEM_RATIO_0": "2"},
        "CUDA_MEM_RATIO_0=2: no CUDA_MEM_LIMIT_0 or CUDA_MEM_LIMIT to divide",
    ),
    ({"CUDA_MEM_RATIO": "2"}, "CUDA_MEM_RATIO=2: no CUDA_MEM_LIMIT or CUDA_MEM_LIMIT_<i> to"),
    (
        {"CUDA_MEM_LIMIT_0": "4g", "CUDA_MEM_RATIO_0": "0.5"},
        "CUDA_MEM_RATIO_0=0.5: bad ratio (a number of 1 or more",
    ),
    ({"CUDA_MEM_LIMIT_0": "4g", "CUDA_MEM_RATIO_0": "two"}, "CUDA_MEM_RATIO_0=two: bad ratio"),
    ({"CUDA_CORE_LIMIT": "abc"}, "CUDA_CORE_LIMIT=abc: bad percent"),
    ({"CUDA_CORE_LIMIT_1": "150"}, "CUDA_CORE_LIMIT_1=150: bad percent"),
    (
        {"CUDA_CORE_LIMIT": "50", "CUDA_CORE_SOFT_LIMIT": "30"},
        "CUDA_CORE_SOFT_LIMIT=30: soft compute limit 30.00% is below the compute limit 50.00% "
        "from CUDA_CORE_LIMIT",
    ),
    ({"CUDA_MEM_OVERSOLD_0": "maybe"}, "CUDA_MEM_OVERSOLD_0=maybe: bad value (true or false)"),
    ({"CUDA_MEMORY_OVERSUBSCRIBE": "yes please"}, "CUDA_MEMORY_OVERSUBSCRIBE=yes please: bad"),
    ({"GPU_DEVICES_UUID": "GPU-1234"}, 'GPU_DEVICES_UUID=GPU-1234: entry 0 "GPU-1234" is not a'),
    ({"GPU_DEVICES_UUID": f"{UUID},"}, 'entry 1 "" is not a GPU UUID'),
    ({"LOGGER_LEVEL": "9"}, "LOGGER_LEVEL=9: unknown level (0 to 5"),
    ({"LOGGER_LEVEL": "debug"}, "LOGGER_LEVEL=debug: unknown level"),
    ({"VGPU_POD_NAME": "-rf"}, "VGPU_POD_NAME=-rf: not a valid name"),
    ({"VGPU_POD_NAME": "a", "VGPU_POD_NAMESPACE": "x/y"}, "VGPU_POD_NAMESPACE=x/y: not a valid"),
    ({"VGPU_CONTAINER_NAME": "c d"}, "VGPU_CONTAINER_NAME=c d: not a valid name"),
    ({"VGPU_POD_UID": "../x"}, "VGPU_POD_UID=../x: not a valid name"),
    (
        {"POD_NAME": "a", "VGPU_POD_NAME": "b"},
        "VGPU_POD_NAME=b: contradicts POD_NAME=a (the same setting)",
    ),
    # vcuda-hook
    (
        {"VCUDA_MEMORY_LIMIT": "(1024 * 1024 * 1024 * 10)"},
        "VCUDA_MEMORY_LIMIT=(1024 * 1024 * 1024 * 10): bad size",
    ),
    ({"VCUDA_MEMORY_LIMIT": "0"}, "VCUDA_MEMORY_LIMIT=0: bad size (a limit of 0"),
    ({"VCUDA_LOG_LEVEL": "loud"}, "VCUDA_LOG_LEVEL=loud: unknown level (trace, debug"),
    # HAMi-core
    ({"GPU_CORE_UTILIZATION_POLICY": "sometimes"}, "GPU_CORE_UTILIZATION_POLICY=sometimes: unkn"),
    ({"CUDA_DEVICE_MEMORY_SHARED_CACHE": "cache"}, "CUDA_DEVICE_MEMORY_SHARED_CACHE=cache: must"),
    (
        {"SHM_PATH": "/pods/a", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/b.cache"},
        "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/b.cache: names the pod folder "
        "/usr/local/vgpu/b.cache, but SHM_PATH names /pods/a",
    ),
    # vgpu.rs
    ({"TF_SHM_FILE": "shm"}, "TF_SHM_FILE=shm: must be an absolute path"),
    ({"TF_SHM_FILE": "/pods/a/"}, "TF_SHM_FILE=/pods/a/: not a file path"),
    # Two systems, one device and limit, two values.
    (
        {MEM: '{"0": "2GiB"}', "CUDA_MEM_LIMIT_0": "1g"},
        f"CUDA_MEM_LIMIT_0=1g: device 0 memory limit 1073741824 bytes contradicts 2147483648 "
        f"bytes from {MEM}",
    ),
    (
        {"CUDA_DEVICE_MEMORY_LIMIT": "2g", "VCUDA_MEMORY_LIMIT": "1g"},
        "VCUDA_MEMORY_LIMIT=1g: all devices memory limit 1073741824 bytes contradicts "
        "2147483648 bytes from CUDA_DEVICE_MEMORY_LIMIT",
    ),
    (
        {"CUDA_DEVICE_SM_LIMIT_0": "20", "CUDA_CORE_LIMIT_0": "30"},
        "CUDA_CORE_LIMIT_0=30: device 0 compute limit 30.00% contradicts 20.00% from "
        "CUDA_DEVICE_SM_LIMIT_0",
    ),
    (
        {"CUDA_MEM_OVERSOLD_0": "false", "CUDA_MEM_LIMIT_0": "4g", "CUDA_MEM_RATIO_0": "2"},
        "CUDA_MEM_OVERSOLD_0=false: device 0 oversubscription limit off contradicts on from "
        "CUDA_MEM_RATIO_0",
    ),
]


@pytest.mark.parametrize(("environment", "expected"), BAD, ids=[e for _, e in BAD])
def test_bad_values_name_the_variable(environment: dict[str, str], expected: str) -> None:
    assert expected in error_of(environment)


def test_an_index_past_gpu_devices_uuid_is_a_warning() -> None:
    # vgpu-manager's own README example sets CUDA_MEM_LIMIT_1 next to a single UUID.
    config = config_of(
        {"GPU_DEVICES_UUID": UUID, "CUDA_MEM_LIMIT_0": "1000m", "CUDA_MEM_LIMIT_1": "1000m"}
    )
    (device,) = config.devices
    assert (device.key, device.memory_limit) == (UUID, 1000 * MIB)
    assert config.warnings == (
        "CUDA_MEM_LIMIT_1=1000m: device 1 has no UUID in GPU_DEVICES_UUID (1 entry): applies to "
        "no GPU",
    )


def test_the_same_value_from_two_systems_is_one_limit() -> None:
    config = config_of(
        {MEM: '{"0": "4GiB"}', "CUDA_MEM_LIMIT_0": "4g", "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m"}
    )
    (device,) = config.devices
    assert (device.memory_limit, device.memory_source) == (4 * GIB, MEM)


def test_more_specific_keys_win_across_systems() -> None:
    config = config_of({"VCUDA_MEMORY_LIMIT": "8g", "CUDA_MEM_LIMIT_1": "2g"})
    devices = by_key(config)
    assert devices["all"].memory_limit == 8 * GIB
    assert devices["1"].memory_limit == 2 * GIB


@pytest.mark.parametrize(
    ("environment", "level", "source"),
    [
        ({"LOGGER_LEVEL": "0"}, "error", "LOGGER_LEVEL"),
        ({"LOGGER_LEVEL": "1"}, "error", "LOGGER_LEVEL"),
        ({"LOGGER_LEVEL": "2"}, "warn", "LOGGER_LEVEL"),
        ({"LOGGER_LEVEL": "3"}, "info", "LOGGER_LEVEL"),
        ({"LOGGER_LEVEL": "4"}, "debug", "LOGGER_LEVEL"),
        ({"LOGGER_LEVEL": "5"}, "debug", "LOGGER_LEVEL"),
        ({"VCUDA_LOG_LEVEL": "debug"}, "debug", "VCUDA_LOG_LEVEL"),
        ({"VCUDA_LOG_LEVEL": "trace"}, "debug", "VCUDA_LOG_LEVEL"),
        ({"VCUDA_LOG_LEVEL": "INFO"}, "info", "VCUDA_LOG_LEVEL"),
        ({"VCUDA_LOG_LEVEL": "critical"}, "error", "VCUDA_LOG_LEVEL"),
        ({"TF_LOG_LEVEL": "error", "LOGGER_LEVEL": "5"}, "error", "TF_LOG_LEVEL"),
        ({"LOGGER_LEVEL": "3", "VCUDA_LOG_LEVEL": "debug"}, "info", "LOGGER_LEVEL"),
    ],
)
def test_log_levels_of_each_system(environment: dict[str, str], level: str, source: str) -> None:
    config = config_of(environment)
    assert config.log.level == level
    assert config.log.level_source == source


def test_vgpu_manager_pod_identity() -> None:
    pod = config_of(
        {
            "VGPU_POD_NAME": "gpu-test",
            "VGPU_POD_NAMESPACE": "team",
            "VGPU_POD_UID": "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
            "VGPU_CONTAINER_NAME": "test",
            "SHM_BASE_PATH": "/base",
        }
    ).pod
    assert pod.source == "VGPU_POD_NAME"
    assert pod.folder == Path("/base/team/gpu-test")
    assert (pod.namespace, pod.name, pod.container) == ("team", "gpu-test", "test")
    assert pod.uid == "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    # Both systems' names for the same pod agree: one pod.
    same = config_of({"POD_NAME": "p", "VGPU_POD_NAME": "p"}).pod
    assert (same.source, same.name) == ("POD_NAME", "p")


def test_pod_folders_of_hami_core_and_vgpu_rs() -> None:
    hami = config_of({"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/abc.cache"}).pod
    assert (hami.source, hami.folder) == (
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        Path("/usr/local/vgpu/abc.cache"),
    )
    assert hami.region_file == Path("/usr/local/vgpu/abc.cache/shm")
    rs = config_of({"TF_SHM_FILE": "/run/tensor-fusion/shm/ns/p/shm"}).pod
    assert (rs.source, rs.folder) == ("TF_SHM_FILE", Path("/run/tensor-fusion/shm/ns/p"))
    agree = config_of({"SHM_PATH": "/pods/a", "TF_SHM_FILE": "/pods/a/shm"}).pod
    assert (agree.source, agree.folder) == ("SHM_PATH", Path("/pods/a"))


def test_utilization_policy_disable_turns_the_compute_limits_off() -> None:
    config = config_of(
        {
            "CUDA_DEVICE_SM_LIMIT": "20",
            "CUDA_DEVICE_MEMORY_LIMIT": "4g",
            "GPU_CORE_UTILIZATION_POLICY": "DISABLE",
        }
    )
    (device,) = config.devices
    assert (device.compute_limit, device.memory_limit) == (None, 4 * GIB)
    assert config.warnings == (
        "GPU_CORE_UTILIZATION_POLICY=DISABLE: the compute limits of this environment are off "
        "(1 device key, from CUDA_DEVICE_SM_LIMIT); a pod region's own limits still apply",
    )
    assert config_of({"GPU_CORE_UTILIZATION_POLICY": "disable"}).warnings == ()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HYPERVISOR_IP", "10.0.0.1"),
        ("HYPERVISOR_PORT", "8000"),
        ("ENABLE_NVML_HOOKS", "false"),
        ("ENABLE_CUDA_HOOKS", "false"),
        ("TF_SKIP_HOOKS_IF_NO_LIMIT", "true"),
        ("TF_VISIBLE_DEVICES", UUID),
    ],
)
def test_vgpu_rs_switches_without_a_counterpart_are_warnings(name: str, value: str) -> None:
    (warning,) = config_of({name: value}).warnings
    assert warning.startswith(f"{name}={value}: vgpu.rs's variable, not supported: ignored")


def test_check_config_names_each_systems_variable() -> None:
    values = {
        "CUDA_MEM_LIMIT_0": "4g",
        "CUDA_MEM_RATIO_0": "2",
        "CUDA_CORE_LIMIT": "30",
        "CUDA_CORE_SOFT_LIMIT": "60",
        "VGPU_POD_NAME": "gpu-test",
        "VGPU_POD_UID": "u-1",
        "LOGGER_LEVEL": "4",
        "VCUDA_MEMORY_LIMIT": "8g",
    }
    table = check_config(**values)
    assert table.returncode == 0, table.stderr
    text = table.stdout
    for shown in (
        "CUDA_MEM_LIMIT_0/CUDA_MEM_RATIO_0",
        "CUDA_CORE_SOFT_LIMIT",
        "VCUDA_MEMORY_LIMIT",
        "VGPU_POD_NAME",
        "VGPU_POD_UID",
        "LOGGER_LEVEL",
    ):
        assert shown in text, shown
    document = json.loads(check_config("--json", **values).stdout)
    assert document["log"] == {"level": "debug", "level_source": "LOGGER_LEVEL", "path": None}
    assert document["pod"]["uid"] == "u-1"
    assert document["pod"]["name_source"] == "VGPU_POD_NAME"
