"""/metrics as dashboards built for dcgm-exporter need it: its labels on every series, the NVML
figures it exports (free memory, memory clock, energy, XID errors), nothing made up where the
driver gives nothing; and the XID counts from NVML events, tolerant where there are none."""

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from vgpu_hypervisor import models, package_version
from vgpu_hypervisor.daemon.metrics import (
    GPU_LABELS,
    HOSTNAME,
    POD_GPU_LABELS,
    POD_LABELS,
    WORKER_LABELS,
    exposition,
    prometheus_registry,
)
from vgpu_hypervisor.daemon.node import NodeView
from vgpu_hypervisor.gpu import NOT_AVAILABLE, DeviceSnapshot, NodeSnapshot
from vgpu_hypervisor.gpu.device import DeviceReader

from .conftest import Daemon

UUID = "GPU-5157a1e0-0000-4000-8000-000000000001"
OTHER = "GPU-5157a1e0-0000-4000-8000-0000000000ff"  # a pod's entry for a GPU not on the node
DCGM_GPU = {"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"}


def device(**fields: Any) -> DeviceSnapshot:
    values: dict[str, Any] = {
        "index": 0,
        "uuid": UUID,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total": 80 << 30,
        "memory_used": 5 << 30,
        "gpu_utilization": 40,
        "memory_utilization": 10,
        "temperature_c": 40,
        "power_draw_mw": 300_000,
        "sm_clock_mhz": 1980,
        "processes": (),
        "process_utilization": (),
        "pci_bus_id": "00000000:1B:00.0",
        "minor_number": 3,
        "memory_free": 74 << 30,
        "memory_clock_mhz": 2619,
        "energy_mj": 123_456_789,
        "xid_errors": ((13, 1), (79, 2)),
    }
    return DeviceSnapshot(**(values | fields))


def view(snapshot_device: DeviceSnapshot) -> NodeView:
    gpu = models.Gpu(
        index=0,
        uuid=UUID,
        name="NVIDIA H100 80GB HBM3",
        memory_total=80 << 30,
        memory_used=5 << 30,
        utilization=40,
        memory_utilization=10,
        temperature_c=40,
        power_draw_w=300.0,
        sm_clock_mhz=1980,
        boost=None,
        pods=1,
        workers=1,
    )
    pod = models.Pod(
        namespace="team",
        name="train",
        path="/x",
        created=None,
        error=None,
        gpus=[
            models.PodGpu(
                uuid=UUID,
                index=0,
                memory_limit=4 << 30,
                memory_used=1 << 30,
                compute_limit=25.0,
                utilization=20,
            ),
            models.PodGpu(
                uuid=OTHER,
                index=None,
                memory_limit=None,
                memory_used=0,
                compute_limit=None,
                utilization=None,
            ),
        ],
        workers=1,
    )
    worker = models.Worker(
        namespace="team",
        pod="train",
        slot=0,
        pid=7,
        host_pid=4242,
        started=None,
        command="python",
        alive=True,
        last_gpu_call=None,
        gpus=[models.WorkerGpu(uuid=UUID.lower(), memory_used=1 << 30, utilization=20)],
    )
    snapshot = NodeSnapshot("nvml", 1.0, 0.01, (snapshot_device,))
    return NodeView(2.0, snapshot, (gpu,), (pod,), (worker,))


def scrape(node: NodeView) -> dict[str, list[Sample]]:
    text = exposition(prometheus_registry(lambda: node, "580.95.05")).decode()
    found: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def test_every_series_carries_dcgm_exporter_labels_with_its_values() -> None:
    series = scrape(view(device()))
    (memory,) = series["tf_gpu_memory_total_bytes"]
    assert memory.labels == {
        "gpu": "0",
        "UUID": UUID,
        "device": "nvidia3",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": HOSTNAME,
        "pci_bus_id": "00000000:1B:00.0",
        "DCGM_FI_DRIVER_VERSION": "580.95.05",
    }
    on_node, elsewhere = series["tf_pod_memory_used_bytes"]
    assert on_node.labels == {
        "namespace": "team",
        "pod": "train",
        "container": "",
        **{key: value for key, value in memory.labels.items() if key != "DCGM_FI_DRIVER_VERSION"},
    }
    # The same label set for a GPU the node does not have: its UUID, the rest empty.
    assert elsewhere.labels.keys() == on_node.labels.keys()
    assert (elsewhere.labels["UUID"], elsewhere.labels["gpu"], elsewhere.labels["device"]) == (
        OTHER,
        "",
        "",
    )
    (worker,) = series["tf_worker_memory_used_bytes"]
    assert worker.labels == {
        "namespace": "team",
        "pod": "train",
        "container": "",
        "pid": "4242",
        "limited": "true",
        "gpu": "0",
        "UUID": UUID.lower(),
        "Hostname": HOSTNAME,
    }
    (workers,) = series["tf_pod_workers"]
    assert set(workers.labels) == set(POD_LABELS)
    assert set(GPU_LABELS) >= DCGM_GPU and set(POD_GPU_LABELS) >= DCGM_GPU
    assert {"namespace", "pod", "container", "gpu"} <= set(WORKER_LABELS)


def test_the_nvml_figures_are_exported_in_base_units() -> None:
    series = scrape(view(device()))
    assert series["tf_gpu_memory_free_bytes"][0].value == 74 << 30
    assert series["tf_gpu_memory_clock_mhz"][0].value == 2619
    assert series["tf_gpu_energy_joules_total"][0].value == pytest.approx(123_456.789)
    xids = {s.labels["xid"]: s.value for s in series["tf_gpu_xid_errors_total"]}
    assert xids == {"13": 1, "79": 2}


def test_what_the_driver_did_not_give_is_left_out() -> None:
    na = NOT_AVAILABLE
    gone = device(memory_free=na, memory_clock_mhz=na, energy_mj=na, xid_errors=na, minor_number=na)
    series = scrape(view(gone))
    for name in ("tf_gpu_memory_free_bytes", "tf_gpu_memory_clock_mhz"):
        assert name not in series
    assert "tf_gpu_energy_joules_total" not in series
    assert "tf_gpu_xid_errors_total" not in series
    assert series["tf_gpu_memory_total_bytes"][0].labels["device"] == ""


def test_build_burst_and_scheduling_policy_are_exported() -> None:
    node = view(device())
    pod = node.pods[0]
    burst = pod.gpus[0].model_copy(update={"compute_burst": 80.0})
    policy = pod.model_copy(update={"gpus": [burst, pod.gpus[1]], "qos": "high", "weight": 4})
    series = scrape(NodeView(node.taken_at, node.snapshot, node.gpus, (policy,), node.workers))
    (build,) = series["tf_build_info"]
    assert (build.labels, build.value) == ({"version": package_version()}, 1)
    (burst_limit,) = series["tf_pod_burst_limit_percent"]  # none on the other GPU: absent
    assert (burst_limit.labels["UUID"], burst_limit.value) == (UUID, 80.0)
    (weight,) = series["tf_pod_scheduling_weight"]
    assert (weight.labels["qos"], weight.labels["pod"], weight.value) == ("high", "train", 4)


def test_tf_gpu_pods_says_what_it_counts() -> None:
    text = exposition(prometheus_registry(lambda: view(device()))).decode()
    (help_line,) = [line for line in text.splitlines() if line.startswith("# HELP tf_gpu_pods ")]
    assert "with or without limits" in help_line


def test_a_daemon_on_the_simulated_gpu_exports_what_its_nvml_gives(daemon: Daemon) -> None:
    created = daemon.api("POST", "/api/v1/pods", json={"name": "p", "gpus": {"1": {}}})
    assert created.status_code == 201, created.text
    found: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(daemon.http.get("/metrics").text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    assert len(found["tf_gpu_memory_free_bytes"]) == 2
    assert len(found["tf_gpu_memory_clock_mhz"]) == 2
    assert all(s.value > 0 for s in found["tf_gpu_energy_joules_total"])
    assert "tf_gpu_xid_errors_total" not in found  # the simulated driver has no events
    gpu = next(s for s in found["tf_gpu_memory_total_bytes"] if s.labels["gpu"] == "1")
    assert gpu.labels["device"] == "nvidia1"
    assert gpu.labels["pci_bus_id"].startswith("00000000:")
    assert gpu.labels["DCGM_FI_DRIVER_VERSION"]
    (pod,) = found["tf_pod_memory_used_bytes"]
    assert {key: pod.labels[key] for key in ("pod", "container", "gpu", "UUID")} == {
        "pod": "p",
        "container": "",
        "gpu": "1",
        "UUID": gpu.labels["UUID"],
    }


# --- XID errors from NVML events -----------------------------------------------------------


class _Events:
    """Scripted NVML events: each read drains what was queued, then NVML's TIMEOUT."""

    def __init__(self) -> None:
        self.queue: list[tuple[int, int]] = []
        self.freed: list[object] = []

    def wait(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0  # a pass never waits for events
        if not self.queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        kind, code = self.queue.pop(0)
        return SimpleNamespace(eventType=kind, eventData=code)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Events]:
    scripted = _Events()
    not_supported = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def fail(*args: object) -> Any:
        raise not_supported

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", fail)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: object())
    monkeypatch.setattr(pynvml, "nvmlEventSetCreate", lambda: "event set")
    monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", lambda handle, kinds, events: None)
    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", scripted.wait)
    monkeypatch.setattr(pynvml, "nvmlEventSetFree", scripted.freed.append)
    yield scripted


def test_xid_errors_are_counted_by_code_across_passes(events: _Events) -> None:
    xid = pynvml.nvmlEventTypeXidCriticalError
    reader = DeviceReader(0)
    assert reader.read().xid_errors == ()  # registered, none yet
    events.queue += [(xid, 79), (xid, 13), (xid, 79)]
    assert reader.read().xid_errors == ((13, 1), (79, 2))
    events.queue += [(xid, 79)]
    assert reader.read().xid_errors == ((13, 1), (79, 3))
    reader.close()
    assert events.freed == ["event set"]
    reader.close()
    assert events.freed == ["event set"]  # freed once


def test_a_flood_of_xids_does_not_stall_a_pass(events: _Events) -> None:
    xid = pynvml.nvmlEventTypeXidCriticalError
    reader = DeviceReader(0)
    events.queue += [(xid, 31)] * 1000
    first = reader.read().xid_errors
    assert first != NOT_AVAILABLE and 0 < first[0][1] < 1000
    while events.queue:
        reader.read()
    assert reader.read().xid_errors == ((31, 1000),)


def test_no_events_or_a_failing_wait_is_not_available(
    events: _Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", refuse)
    assert DeviceReader(0).read().xid_errors is NOT_AVAILABLE
    assert events.freed == ["event set"]  # the set made for the refused registration

    monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", lambda handle, kinds, events: None)
    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", lambda *args: refuse())
    assert DeviceReader(0).read().xid_errors is NOT_AVAILABLE
