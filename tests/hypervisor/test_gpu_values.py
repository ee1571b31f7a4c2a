"""The NOT_AVAILABLE sentinel and the snapshots' plain (JSON) form."""

import copy
import dataclasses
import json
import pickle

import pytest
from vgpu_hypervisor.gpu import (
    NOT_AVAILABLE,
    DeviceSnapshot,
    NodeSnapshot,
    NotAvailable,
    ProcessMemory,
    ProcessUtilization,
    or_default,
)

UUID = "GPU-5157a1e0-0000-4000-8000-000000000001"


def device(index: int = 0, uuid: str = UUID) -> DeviceSnapshot:
    na = NOT_AVAILABLE
    return DeviceSnapshot(
        index=index,
        uuid=uuid,
        name="NVIDIA H100 80GB HBM3",
        memory_total=80 << 30,
        memory_used=1 << 30,
        gpu_utilization=50,
        memory_utilization=20,
        temperature_c=na,
        power_draw_mw=386000,
        sm_clock_mhz=1162,
        processes=(ProcessMemory(pid=42, used_memory=1 << 30), ProcessMemory(7, na)),
        process_utilization=(ProcessUtilization(42, 1_700_000_000_000_000, 50, 20, 0, na),),
    )


def test_not_available_is_one_falsy_value_shown_as_na() -> None:
    assert NotAvailable.NOT_AVAILABLE is NOT_AVAILABLE
    assert repr(NOT_AVAILABLE) == str(NOT_AVAILABLE) == f"{NOT_AVAILABLE}" == "N/A"
    assert not NOT_AVAILABLE
    assert copy.copy(NOT_AVAILABLE) is NOT_AVAILABLE
    assert copy.deepcopy(NOT_AVAILABLE) is NOT_AVAILABLE
    assert pickle.loads(pickle.dumps(NOT_AVAILABLE)) is NOT_AVAILABLE
    assert or_default(NOT_AVAILABLE, 0) == 0
    assert or_default(5, 0) == 5
    assert or_default(0, 7) == 0  # a real zero is not "not available"


def test_snapshot_to_dict_is_json_with_none_for_not_available() -> None:
    node = NodeSnapshot(backend="simulated", taken_at=1.5, duration=0.001, devices=(device(),))
    plain = node.to_dict()
    assert json.loads(json.dumps(plain)) == plain
    first = plain["devices"][0]
    assert first["temperature_c"] is None
    assert first["memory_used"] == 1 << 30
    assert first["processes"] == [
        {"pid": 42, "used_memory": 1 << 30},
        {"pid": 7, "used_memory": None},
    ]
    assert first["process_utilization"][0]["sm_utilization"] == 50
    assert first["process_utilization"][0]["decoder_utilization"] is None
    assert plain["backend"] == "simulated"
    assert ProcessMemory(7, NOT_AVAILABLE).to_dict() == {"pid": 7, "used_memory": None}


def test_snapshots_are_immutable() -> None:
    snapshot = device()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.memory_used = 0  # type: ignore[misc]


def test_node_finds_a_device_by_index_or_uuid() -> None:
    other = "GPU-5157a1e0-0000-4000-8000-000000000002"
    node = NodeSnapshot(
        backend="nvml", taken_at=0.0, duration=0.0, devices=(device(0), device(1, other))
    )
    assert node.device(1) is node.devices[1]
    assert node.device(other.upper()) is node.devices[1]
    assert node.device(UUID) is node.devices[0]
    assert node.device(2) is None
    assert node.device("GPU-missing") is None
