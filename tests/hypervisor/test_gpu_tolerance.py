"""The tolerant NVML layer without a library: pynvml's functions are replaced by failing or
scripted fakes, and every pass still gives a complete snapshot."""

import logging
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest
from vgpu_hypervisor.gpu import NOT_AVAILABLE, DeviceSnapshot, nvml
from vgpu_hypervisor.gpu.device import DeviceReader

FIELDS = [name for name in DeviceSnapshot.__dataclass_fields__ if name != "index"]


def raising(error: BaseException) -> Callable[..., Any]:
    def fail(*args: object, **kwargs: object) -> Any:
        raise error

    return fail


def nvml_error(code: int) -> BaseException:
    error: BaseException = pynvml.NVMLError(code)
    return error


def test_query_gives_the_value_or_not_available() -> None:
    assert nvml.query("q1", lambda: 3) == 3
    not_supported = raising(nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED))
    assert nvml.query("q2", not_supported) is NOT_AVAILABLE


def test_query_tries_older_variants_only_where_the_newer_one_is_missing() -> None:
    missing = raising(nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND))
    assert nvml.query("q3", missing, lambda: "v1") == "v1"
    assert nvml.query("q4", raising(AttributeError("old pynvml")), lambda: "v1") == "v1"
    denied = raising(nvml_error(pynvml.NVML_ERROR_NO_PERMISSION))
    assert nvml.query("q5", denied, lambda: "v1") is NOT_AVAILABLE
    assert nvml.query("q6", missing, missing) is NOT_AVAILABLE


def test_unexpected_failures_are_not_available_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=nvml.__name__):
        for _ in range(3):
            assert nvml.query("q7", raising(ValueError("odd value"))) is NOT_AVAILABLE
    assert [record.getMessage() for record in caplog.records] == [
        "q7: not available (unexpected ValueError: odd value)"
    ]


ERRORS = [
    nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED),
    nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
    nvml_error(pynvml.NVML_ERROR_NO_PERMISSION),
    nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST),
    nvml_error(pynvml.NVML_ERROR_UNKNOWN),
    nvml_error(pynvml.NVML_ERROR_UNINITIALIZED),
    TypeError("pynvml changed a signature"),
    OSError("ioctl failed"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: type(error).__name__)
def test_a_device_whose_every_query_fails_still_gives_a_snapshot(
    monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    # Every pynvml function fetches its C function through this one: all of them fail.
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", raising(error))
    reader = DeviceReader(3)
    for _ in range(2):  # no handle: asked again on the next pass, still no exception
        snapshot = reader.read()
        assert snapshot.index == 3
        assert all(getattr(snapshot, name) is NOT_AVAILABLE for name in FIELDS)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: object())
    snapshot = reader.read()
    assert all(getattr(snapshot, name) is NOT_AVAILABLE for name in FIELDS)


def test_partial_answers_fill_what_they_can(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        pynvml, "_nvmlGetFunctionPointer", raising(nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED))
    )
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: object())
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda handle: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda handle: 0xFFFFFFFF)  # no value
    memory = SimpleNamespace(total=80 << 30, used=1 << 30, free=79 << 30, reserved=0)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda handle, version=None: memory)
    snapshot = DeviceReader(0).read()
    assert snapshot.name == "NVIDIA H100 80GB HBM3"
    assert (snapshot.memory_total, snapshot.memory_used) == (80 << 30, 1 << 30)
    assert snapshot.power_draw_mw is NOT_AVAILABLE
    assert snapshot.uuid is NOT_AVAILABLE
    assert snapshot.processes is NOT_AVAILABLE


def test_processes_fall_back_to_an_older_query(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = raising(nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v3", missing)
    listed = [
        SimpleNamespace(pid=10, usedGpuMemory=1 << 30),
        SimpleNamespace(pid=11, usedGpuMemory=None),
    ]
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v2", lambda handle: listed)
    processes = nvml.device_processes(nvml.Handle(object()))
    assert processes is not NOT_AVAILABLE
    assert [(p.pid, p.used_memory) for p in processes] == [(10, 1 << 30), (11, NOT_AVAILABLE)]


def sample(pid: int, stamp: int, sm: int) -> SimpleNamespace:
    return SimpleNamespace(
        pid=pid, timeStamp=stamp, smUtil=sm, memUtil=sm // 2, encUtil=0, decUtil=0
    )


def test_process_samples_follow_the_last_seen_timestamp(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time_ns() // 1000
    asked: list[int] = []
    answers: list[Any] = [
        [sample(1, now - 500, 10), sample(2, now - 400, 30), sample(1, now - 100, 20)],
        nvml_error(pynvml.NVML_ERROR_NOT_FOUND),  # nothing ran since
        [sample(1, now - 100, 20), sample(1, now + 200, 40)],  # an old one is left out
        nvml_error(pynvml.NVML_SUCCESS),  # pynvml's way of saying "no samples" on some drivers
    ]

    def utilization(handle: object, last_seen: int) -> Any:
        asked.append(last_seen)
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(
        pynvml, "_nvmlGetFunctionPointer", raising(nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED))
    )
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: object())
    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", utilization)
    reader = DeviceReader(0)
    passes = [reader.read().process_utilization for _ in range(4)]

    assert now - 1_000_000 <= asked[0] < now - 900_000  # the first pass: the last second
    assert asked[1:] == [now - 100, now - 100, now + 200]
    first, second, third, fourth = passes
    assert first is not NOT_AVAILABLE and second is not NOT_AVAILABLE
    assert third is not NOT_AVAILABLE
    assert sorted((s.pid, s.timestamp_us, s.sm_utilization) for s in first) == [
        (1, now - 100, 20),
        (2, now - 400, 30),
    ]
    assert second == ()
    assert [(s.pid, s.sm_utilization) for s in third] == [(1, 40)]
    assert fourth == ()
