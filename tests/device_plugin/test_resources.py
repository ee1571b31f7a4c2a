"""What the plugin advertises, and the settings that shape it: bad values are one-line errors."""

import pytest
from vgpu_hypervisor.device_plugin.resources import (
    Gpu,
    ResourceError,
    check_inventory,
    device_ids,
    gpu_of,
)
from vgpu_hypervisor.settings import SettingsError, load_settings

UUID = "GPU-5157a1e0-0000-4000-8000-000000000001"
GiB = 1 << 30
MiB = 1 << 20


def test_device_ids_per_kind_name_their_gpu_and_fit_the_kubelet_limit() -> None:
    gpus = [Gpu(UUID, 80 * GiB)]
    assert device_ids("gpu", gpus, 3, GiB) == [f"{UUID}-0", f"{UUID}-1", f"{UUID}-2"]
    assert len(device_ids("memory", gpus, 3, GiB)) == 80
    assert len(device_ids("compute", gpus, 3, GiB)) == 100
    for kind in ("gpu", "memory", "compute"):
        for one in device_ids(kind, gpus, 3, GiB):
            assert gpu_of(one) == UUID
            assert len(one) <= 63  # the kubelet's limit on a device ID


def test_a_memory_unit_too_small_for_one_message_is_refused_naming_the_setting() -> None:
    check_inventory([Gpu(UUID, 16 * GiB)], 10, MiB)  # 16384 devices fit
    with pytest.raises(ResourceError) as caught:
        check_inventory([Gpu(UUID, 80 * GiB)] * 2, 10, MiB)
    assert str(caught.value) == (
        "163840 memory devices do not fit the kubelet's 4 MiB message: raise --gpu-memory-unit"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"gpu_resource": "gpu"}, "--gpu-resource=gpu: expected an extended resource name"),
        ({"gpu_memory_resource": "kubernetes.io/mem"}, "domains are reserved"),
        ({"gpu_shares": "0"}, "--gpu-shares=0: expected a whole number from 1 to 1000"),
        ({"gpu_shares": "ten"}, "--gpu-shares=ten: expected a whole number from 1 to 1000"),
        ({"gpu_memory_unit": "512KiB"}, "--gpu-memory-unit=512KiB: must be at least 1MiB"),
        ({"token_review_url": "api:6443"}, "--token-review-url=api:6443: expected an http"),
        ({"token_review_allow": " , "}, "expected at least one user or group name"),
        ({"device_plugin_dir": "plugins"}, None),  # a relative flag path is from here: fine
    ],
)
def test_bad_plugin_settings_are_one_line_errors(
    flags: dict[str, str], message: str | None
) -> None:
    if message is None:
        load_settings(flags, environ={})
        return
    with pytest.raises(SettingsError) as caught:
        load_settings(flags, environ={})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_plugin_settings_from_the_environment() -> None:
    settings = load_settings(
        {},
        environ={
            "TF_HYPERVISOR_DEVICE_PLUGIN": "true",
            "TF_HYPERVISOR_GPU_SHARES": "4",
            "TF_HYPERVISOR_GPU_MEMORY_UNIT": "256MiB",
            "TF_HYPERVISOR_TOKEN_REVIEW_ALLOW": "system:masters, ops",
        },
    )
    assert settings.device_plugin and settings.gpu_shares == 4
    assert settings.gpu_memory_unit == 256 * MiB
    assert settings.token_review_allow == ("system:masters", "ops")
    with pytest.raises(SettingsError) as caught:
        load_settings({}, environ={"TF_HYPERVISOR_GPU_SHARES": "-1"})
    assert (
        str(caught.value) == "TF_HYPERVISOR_GPU_SHARES=-1: expected a whole number from 1 to 1000"
    )
