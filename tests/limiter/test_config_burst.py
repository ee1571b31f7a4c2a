"""TENSOR_FUSION_CUDA_SOFT_LIMIT (the burst compute limit) and TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE
as the library reads them, and as tf-limiter check-config shows them."""

import json

import pytest

from tests.limiter.test_config import UUID, by_key, check_config, config_of, error_of

UP = "TENSOR_FUSION_CUDA_UP_LIMIT"
SOFT = "TENSOR_FUSION_CUDA_SOFT_LIMIT"
OVER = "TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE"


def test_soft_limit_and_oversubscription_per_key() -> None:
    config = config_of(
        {
            UP: '{"0": 30, "1": 20}',
            SOFT: f'{{"0": "60%", "{UUID.upper()}": 80.5}}',
            OVER: '{"0": true, "1": "false"}',
            "TENSOR_FUSION_CUDA_MEM_LIMIT": '{"0": "4GiB"}',
        }
    )
    devices = by_key(config)
    assert (devices["0"].soft_limit, devices["0"].soft_source) == (6000, SOFT)
    assert (devices["0"].oversubscribe, devices["0"].oversubscribe_source) == (True, OVER)
    assert devices["1"].oversubscribe is False
    assert devices[UUID].soft_limit == 8050
    assert devices[UUID].oversubscribe is None
    assert devices[UUID].oversubscribe_source is None
    assert config.warnings == ()


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({SOFT: '{"0": 0}'}, f'{SOFT}={{"0": 0}}: bad percent 0 for key "0"'),
        ({SOFT: '{"0": 100.5}'}, 'bad percent 100.5 for key "0"'),
        ({SOFT: '{"x": 50}'}, 'bad device key "x"'),
        ({OVER: '{"0": 1}'}, f'{OVER}={{"0": 1}}: bad value 1 for key "0" (true or false)'),
        ({OVER: '{"0": "sometimes"}'}, 'bad value "sometimes"'),
        ({OVER: '{"0": true, "0": false}'}, "given twice with different values (on and off)"),
        (
            {UP: '{"0": 50}', SOFT: '{"0": 40}'},
            f'{SOFT}={{"0": 40}}: soft compute limit 40.00% is below the compute limit 50.00% '
            f"from {UP}",
        ),
        (
            {"CUDA_DEVICE_SM_LIMIT": "50", SOFT: '{"3": 45}'},
            "below the compute limit 50.00% from CUDA_DEVICE_SM_LIMIT",
        ),
    ],
)
def test_bad_soft_and_oversubscribe_values_name_the_variable(
    values: dict[str, str], expected: str
) -> None:
    assert expected in error_of(values)


def test_a_soft_limit_without_any_compute_limit_is_a_warning() -> None:
    config = config_of({SOFT: '{"0": 70}'})
    assert config.warnings == (
        f"{SOFT}: soft compute limit 70.00% without any compute limit: ignored (no limit to "
        "burst from)",
    )


@pytest.mark.parametrize(
    ("values", "warning"),
    [
        (
            {UP: '{"0": 30}', SOFT: '{"1": 70}'},
            f"{SOFT}: soft compute limit 70.00% without a compute limit on that device: ignored "
            "(no limit to burst from)",
        ),
        (
            {OVER: '{"0": true}'},
            f"{OVER}: memory oversubscription without any memory limit: ignored (no limit to go "
            "past)",
        ),
        (
            {"TENSOR_FUSION_CUDA_MEM_LIMIT": '{"0": "4GiB"}', OVER: '{"1": true}'},
            f"{OVER}: memory oversubscription without a memory limit on that device: ignored (no "
            "limit to go past)",
        ),
    ],
)
def test_a_limit_that_has_nothing_to_act_on_is_a_warning(
    values: dict[str, str], warning: str
) -> None:
    """Before, a burst for a device that another device's compute limit left unlimited, and
    oversubscription without a memory limit, were taken without a word."""
    assert config_of(values).warnings == (warning,)


def test_check_config_shows_both_with_their_source() -> None:
    values = {UP: '{"0": 30}', SOFT: '{"0": 60}', OVER: '{"0": true}'}
    table = check_config(**values)
    assert table.returncode == 0, table.stderr
    rows = [line.split() for line in table.stdout.splitlines()]
    assert ["soft", "compute", "60", "%", SOFT] in rows
    assert ["oversubscribe", "on", OVER] in rows
    document = json.loads(check_config("--json", **values).stdout)
    (device,) = document["devices"]
    assert device["soft_limit"] == 6000
    assert device["soft_source"] == SOFT
    assert device["oversubscribe"] is True
    assert device["oversubscribe_source"] == OVER
    refused = check_config(**{UP: '{"0": 50}', SOFT: '{"0": 10}'})
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert "soft compute limit 10.00% is below the compute limit 50.00%" in refused.stderr
