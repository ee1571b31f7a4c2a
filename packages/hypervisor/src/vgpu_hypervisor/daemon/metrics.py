"""Metrics of the newest NodeView: Prometheus exposition for /metrics, and influx line protocol
(vgpu.rs's `tf_gpu_usage` and `tf_worker_usage`) for the metrics file.

Prometheus names are ours (`tf_*`); the labels are dcgm-exporter's, with the same values, so a
dashboard joins our series with DCGM_FI_* ones (`on(UUID)`, `on(Hostname, gpu)`): a GPU by `gpu`
(index), `UUID`, `device` ("nvidia0"), `modelName`, `pci_bus_id`, `Hostname` and
`DCGM_FI_DRIVER_VERSION`; a pod by `namespace`, `pod` and `container` (empty until a Kubernetes
identity fills it: the label set stays the same either way). We do not export DCGM_FI_* names
ourselves: a node that runs dcgm-exporter would then have two sources of one series, and a
`sum()` over them counts the GPU twice.

A value the driver did not give is left out, never written as 0.
"""

import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from vgpu_common.visible import CONTROL_CODES

from vgpu_hypervisor import models, package_version
from vgpu_hypervisor.daemon.node import NodeView
from vgpu_hypervisor.gpu import NOT_AVAILABLE, DeviceSnapshot, Value

HOSTNAME = socket.gethostname()

GPU_LABELS = (
    "gpu",
    "UUID",
    "device",
    "modelName",
    "Hostname",
    "pci_bus_id",
    "DCGM_FI_DRIVER_VERSION",
)
# A pod's share of one GPU: the pod, then the GPU as GPU_LABELS names it (less the driver).
POD_GPU_LABELS = ("namespace", "pod", "container", *GPU_LABELS[:-1])
POD_LABELS = ("namespace", "pod", "container", "Hostname")
WORKER_LABELS = ("namespace", "pod", "container", "pid", "limited", "gpu", "UUID", "Hostname")


@dataclass(frozen=True)
class _GpuRow:
    """A GPU of the view and the NVML pass it came from (the fields the API does not carry)."""

    gpu: models.Gpu
    device: DeviceSnapshot | None

    def known(self, value_of: Callable[[DeviceSnapshot], Value[int]]) -> int | None:
        if self.device is None:
            return None
        value = value_of(self.device)
        return None if value is NOT_AVAILABLE else value


# name, help, value of a GPU
_GPU_GAUGES: tuple[tuple[str, str, Callable[[_GpuRow], float | None]], ...] = (
    ("tf_gpu_memory_total_bytes", "Memory of the GPU.", lambda r: r.gpu.memory_total),
    (
        "tf_gpu_memory_used_bytes",
        "Memory in use on the GPU (all processes).",
        lambda r: r.gpu.memory_used,
    ),
    (
        "tf_gpu_memory_free_bytes",
        "Memory free on the GPU (less than total - used by the driver's reserve).",
        lambda r: r.known(lambda d: d.memory_free),
    ),
    ("tf_gpu_utilization_percent", "Share of time the GPU was busy.", lambda r: r.gpu.utilization),
    (
        "tf_gpu_memory_utilization_percent",
        "Share of time the GPU's memory was read or written.",
        lambda r: r.gpu.memory_utilization,
    ),
    ("tf_gpu_temperature_celsius", "GPU temperature.", lambda r: r.gpu.temperature_c),
    ("tf_gpu_power_watts", "GPU power draw.", lambda r: r.gpu.power_draw_w),
    ("tf_gpu_sm_clock_mhz", "SM clock.", lambda r: r.gpu.sm_clock_mhz),
    (
        "tf_gpu_memory_clock_mhz",
        "Memory clock.",
        lambda r: r.known(lambda d: d.memory_clock_mhz),
    ),
    (
        "tf_gpu_boost_ratio",
        "Limited pods' GPU time is charged times this (boost correction; absent: none).",
        lambda r: r.gpu.boost,
    ),
    (
        "tf_gpu_pods",
        "Pods that have an entry for the GPU, with or without limits.",
        lambda r: r.gpu.pods,
    ),
    ("tf_gpu_workers", "Workers holding memory on the GPU.", lambda r: r.gpu.workers),
)
# name, help, value of a pod's share of a GPU
_POD_GAUGES: tuple[tuple[str, str, Callable[[models.PodGpu], float | None]], ...] = (
    ("tf_pod_memory_used_bytes", "Memory the pod holds on the GPU.", lambda g: g.memory_used),
    (
        "tf_pod_host_memory_bytes",
        "Host memory of the pod's oversubscribed allocations for the GPU.",
        lambda g: g.host_memory_used,
    ),
    (
        "tf_pod_memory_limit_bytes",
        "The pod's memory limit on the GPU (absent: none).",
        lambda g: g.memory_limit,
    ),
    (
        "tf_pod_compute_limit_percent",
        "The pod's compute limit on the GPU (absent: none).",
        lambda g: g.compute_limit,
    ),
    (
        "tf_pod_burst_limit_percent",
        "The pod's soft (burst) limit on the GPU, its share while no other pod wants it "
        "(absent: none).",
        lambda g: g.compute_burst,
    ),
    (
        "tf_pod_utilization_percent",
        "SM utilization of the pod's workers on the GPU.",
        lambda g: g.utilization,
    ),
)
# Counters of a pod on a GPU (the limiter's region words): the scheduler's times, refusals.
_POD_COUNTERS: tuple[tuple[str, str, Callable[[models.PodGpu], float]], ...] = (
    (
        "tf_pod_gpu_seconds",
        "GPU time charged to the pod (its achieved share).",
        lambda g: g.gpu_seconds,
    ),
    (
        "tf_pod_throttled_seconds",
        "Time the pod's launches waited for their share or for another pod.",
        lambda g: g.throttled_seconds,
    ),
    (
        "tf_pod_burst_seconds",
        "GPU time the pod ran above its hard limit.",
        lambda g: g.burst_seconds,
    ),
    (
        "tf_pod_oom_refusals",
        "Allocations of the pod refused at its memory limit on the GPU.",
        lambda g: g.oom_refusals,
    ),
)


class ViewCollector(Collector):
    """Turns the newest view into metrics at each scrape (nothing is kept between scrapes, so a
    pod that is gone leaves no stale series). ``driver_version`` fills DCGM_FI_DRIVER_VERSION."""

    def __init__(self, view: Callable[[], NodeView], driver_version: str = "") -> None:
        self._view = view
        self._driver = driver_version

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        devices = {d.index: d for d in view.snapshot.devices} if view.snapshot else {}
        rows = [_GpuRow(gpu, devices.get(gpu.index)) for gpu in view.gpus]
        identity = {row.gpu.uuid.lower(): self._gpu_labels(row) for row in rows if row.gpu.uuid}
        yield from self._gpus(rows)
        yield from self._pods(view.pods, identity)
        yield from self._workers(view.workers, identity)
        info = GaugeMetricFamily(
            "tf_hypervisor_last_sample_timestamp_seconds",
            "When the daemon last read the regions.",
        )
        info.add_metric([], view.taken_at)
        yield info
        build = GaugeMetricFamily(
            "tf_build_info", "Always 1: the daemon's version.", labels=("version",)
        )
        build.add_metric([package_version()], 1)
        yield build

    def _gpu_labels(self, row: _GpuRow) -> list[str]:
        device = row.device
        minor = device.minor_number if device is not None else NOT_AVAILABLE
        bus = device.pci_bus_id if device is not None else NOT_AVAILABLE
        return [
            str(row.gpu.index),
            row.gpu.uuid or "",
            "" if minor is NOT_AVAILABLE else f"nvidia{minor}",
            row.gpu.name or "",
            HOSTNAME,
            "" if bus is NOT_AVAILABLE else bus,
            self._driver,
        ]

    def _gpus(self, rows: list[_GpuRow]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        for name, text, value_of in _GPU_GAUGES:
            family = GaugeMetricFamily(name, text, labels=GPU_LABELS)
            for row in rows:
                value = value_of(row)
                if value is not None:
                    family.add_metric(self._gpu_labels(row), value)
            yield family
        energy = CounterMetricFamily(
            "tf_gpu_energy_joules",
            "Energy the GPU used since the driver loaded.",
            labels=GPU_LABELS,
        )
        xids = CounterMetricFamily(
            "tf_gpu_xid_errors",
            "XID errors (critical driver events) of the GPU since the daemon started, by code.",
            labels=(*GPU_LABELS, "xid"),
        )
        for row in rows:
            millijoules = row.known(lambda d: d.energy_mj)
            if millijoules is not None:
                energy.add_metric(self._gpu_labels(row), millijoules / 1000)
            if row.device is not None and row.device.xid_errors is not NOT_AVAILABLE:
                for code, count in row.device.xid_errors:
                    xids.add_metric([*self._gpu_labels(row), str(code)], count)
        yield energy
        yield xids

    def _pods(self, pods: Iterable[models.Pod], identity: dict[str, list[str]]) -> Iterator[Metric]:
        pods = list(pods)
        for name, text, value_of in _POD_GAUGES:
            family = GaugeMetricFamily(name, text, labels=POD_GPU_LABELS)
            for pod in pods:
                for gpu in pod.gpus:
                    value = value_of(gpu)
                    if value is not None:
                        family.add_metric(_pod_gpu_labels(pod, gpu, identity), value)
            yield family
        workers = GaugeMetricFamily("tf_pod_workers", "Workers of the pod.", labels=POD_LABELS)
        errors = GaugeMetricFamily(
            "tf_pod_region_error",
            "1 when the pod's region file cannot be read.",
            labels=POD_LABELS,
        )
        for pod in pods:
            labels = [pod.namespace, pod.name, "", HOSTNAME]
            workers.add_metric(labels, pod.workers)
            errors.add_metric(labels, 0 if pod.error is None else 1)
        yield workers
        yield errors
        frozen = GaugeMetricFamily(
            "tf_pod_frozen", "1 while the pod is frozen (its launches wait).", labels=POD_LABELS
        )
        for pod in pods:
            frozen.add_metric([pod.namespace, pod.name, "", HOSTNAME], 1 if pod.frozen else 0)
        yield frozen
        weight = GaugeMetricFamily(
            "tf_pod_scheduling_weight",
            "The pod's scheduling weight in effect, with its class (qos).",
            labels=(*POD_LABELS, "qos"),
        )
        for pod in pods:
            weight.add_metric([pod.namespace, pod.name, "", HOSTNAME, pod.qos], pod.weight)
        yield weight
        for name, text, count_of in _POD_COUNTERS:
            counter = CounterMetricFamily(name, text, labels=POD_GPU_LABELS)
            for pod in pods:
                for gpu in pod.gpus:
                    counter.add_metric(_pod_gpu_labels(pod, gpu, identity), count_of(gpu))
            yield counter

    def _workers(
        self, workers: Iterable[models.Worker], identity: dict[str, list[str]]
    ) -> Iterator[GaugeMetricFamily]:
        memory = GaugeMetricFamily(
            "tf_worker_memory_used_bytes", "Memory a worker holds.", labels=WORKER_LABELS
        )
        utilization = GaugeMetricFamily(
            "tf_worker_utilization_percent",
            "SM utilization of a worker.",
            labels=WORKER_LABELS,
        )
        for worker in workers:
            pid = str(worker.host_pid or worker.pid)
            for gpu in worker.gpus:
                index = identity.get(gpu.uuid.lower(), [""])[0]
                labels = [
                    worker.namespace,
                    worker.pod,
                    worker.container or "",
                    pid,
                    "true" if worker.limited else "false",
                    index,
                    gpu.uuid,
                    HOSTNAME,
                ]
                memory.add_metric(labels, gpu.memory_used)
                if gpu.utilization is not None:
                    utilization.add_metric(labels, gpu.utilization)
        yield memory
        yield utilization


def _pod_gpu_labels(
    pod: models.Pod, gpu: models.PodGpu, identity: dict[str, list[str]]
) -> list[str]:
    """The pod's labels, then its GPU's (the UUID alone when the GPU is not on this node)."""
    known = identity.get(gpu.uuid.lower())
    if known is None:
        index = "" if gpu.index is None else str(gpu.index)
        known = [index, gpu.uuid, "", "", HOSTNAME, ""]
    return [pod.namespace, pod.name, "", *known[: len(GPU_LABELS) - 1]]


def prometheus_registry(
    view: Callable[[], NodeView], driver_version: str = ""
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ViewCollector(view, driver_version))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


# --- influx line protocol -------------------------------------------------------------------


_BLANKS = dict.fromkeys(CONTROL_CODES, " ")  # the control characters vgpu_common.visible escapes


def _escape_tag(text: str) -> str:
    """A tag value as line protocol writes it. Control characters have no escape there, and a
    newline ended the line: a UUID a tenant wrote into its region with one added lines of its
    own to the file, so each is a blank."""
    text = text.translate(_BLANKS)
    return text.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1  # an influx integer: signed, 64 bits


def _line(measurement: str, tags: dict[str, str], fields: dict[str, float | int], ns: int) -> str:
    tag_text = "".join(f",{key}={_escape_tag(value)}" for key, value in tags.items() if value)
    # Integers held to what an influx integer holds: a pod's usage words are its tenant's to
    # write, and one past 2**63 made a line its reader refused ("value out of range").
    field_text = ",".join(
        f"{key}={min(max(value, _INT_MIN), _INT_MAX)}i"
        if isinstance(value, int)
        else f"{key}={float(value)!r}"
        for key, value in fields.items()
    )
    return f"{measurement}{tag_text} {field_text} {ns}\n"


def _gpu_fields(gpu: models.Gpu) -> dict[str, float | int]:
    fields: dict[str, float | int] = {}
    if gpu.memory_used is not None:
        fields["memory_bytes"] = gpu.memory_used
        if gpu.memory_total:
            fields["memory_percentage"] = 100.0 * gpu.memory_used / gpu.memory_total
    if gpu.utilization is not None:
        fields["compute_percentage"] = float(gpu.utilization)
    if gpu.temperature_c is not None:
        fields["temperature"] = float(gpu.temperature_c)
    if gpu.sm_clock_mhz is not None:
        fields["sm_clock_mhz"] = float(gpu.sm_clock_mhz)
    if gpu.power_draw_w is not None:
        fields["power_usage"] = gpu.power_draw_w
    if gpu.boost is not None:
        fields["boost"] = gpu.boost
    return fields


def influx_lines(view: NodeView, node: str = HOSTNAME) -> list[str]:
    """`tf_gpu_usage` per GPU and `tf_worker_usage` per pod and GPU (vgpu.rs's worker is a pod),
    stamped with the view's time in nanoseconds."""
    ns = int(view.taken_at * 1e9)
    lines = []
    for gpu in view.gpus:
        fields: dict[str, float | int] = _gpu_fields(gpu)
        if gpu.uuid is not None and fields:
            lines.append(_line("tf_gpu_usage", {"uuid": gpu.uuid, "node": node}, fields, ns))
    totals = {gpu.uuid.lower(): gpu.memory_total for gpu in view.gpus if gpu.uuid}
    for pod in view.pods:
        for share in pod.gpus:
            fields = {"memory_bytes": share.memory_used}
            if share.host_memory_used:  # oversubscribed: the part kept in host memory
                fields["host_memory_bytes"] = share.host_memory_used
            if share.utilization is not None:
                fields["compute_percentage"] = float(share.utilization)
            total = totals.get(share.uuid.lower())
            if total:
                fields["memory_percentage"] = 100.0 * share.memory_used / total
            tags = {
                "uuid": share.uuid,
                "node": node,
                "namespace": pod.namespace,
                "worker": pod.name,
                "workload": pod.name,
            }
            lines.append(_line("tf_worker_usage", tags, fields, ns))
    return lines


class SchedulerEvents:
    """`tf_scheduler_event` lines (vgpu.rs's name) for what changed since the previous view: a
    pod frozen or resumed, and a pod starting or ending a burst on a GPU (its burst time grew
    in this interval, and did not in the one before, or the other way round)."""

    def __init__(self) -> None:
        self._frozen: dict[tuple[str, str], bool] = {}
        self._burst: dict[tuple[str, str, str], tuple[float, bool]] = {}

    def lines(self, view: NodeView, node: str = HOSTNAME) -> list[str]:
        ns = int(view.taken_at * 1e9)
        lines = []
        frozen: dict[tuple[str, str], bool] = {}
        burst: dict[tuple[str, str, str], tuple[float, bool]] = {}
        for pod in view.pods:
            key = (pod.namespace, pod.name)
            frozen[key] = pod.frozen
            tags = {"node": node, "namespace": pod.namespace, "worker": pod.name}
            if pod.frozen != self._frozen.get(key, False):
                event = "freeze" if pod.frozen else "resume"
                event_tags = tags | {"event": event}
                lines.append(_line("tf_scheduler_event", event_tags, {"value": 1}, ns))
            for gpu in pod.gpus:
                seen, was_bursting = self._burst.get((*key, gpu.uuid), (gpu.burst_seconds, False))
                bursting = gpu.burst_seconds > seen
                burst[(*key, gpu.uuid)] = (gpu.burst_seconds, bursting)
                if bursting != was_bursting:
                    event = "burst_start" if bursting else "burst_end"
                    fields: dict[str, float | int] = {
                        "value": 1,
                        "burst_seconds": gpu.burst_seconds,
                    }
                    gpu_tags = tags | {"uuid": gpu.uuid, "event": event}
                    lines.append(_line("tf_scheduler_event", gpu_tags, fields, ns))
        self._frozen, self._burst = frozen, burst
        return lines


class MetricsFile:
    """Appends lines to ``path``; past ``rotate_bytes`` the file becomes ``path.1`` (the one
    before is dropped) and a new one starts. Created 0644 with its folder."""

    def __init__(self, path: Path, rotate_bytes: int) -> None:
        self.path = path
        self.rotate_bytes = rotate_bytes
        self._lock = threading.Lock()

    def write(self, lines: Iterable[str]) -> None:
        data = "".join(lines).encode()
        if not data:
            return
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size and size + len(data) > self.rotate_bytes:
                self.path.replace(self.path.with_name(self.path.name + ".1"))
            # 0640: the file names every pod and its use, which the API keeps behind its token.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
