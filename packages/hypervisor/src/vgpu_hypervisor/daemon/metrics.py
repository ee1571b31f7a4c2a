"""Metrics of the newest NodeView: Prometheus exposition for /metrics, and influx line protocol
(vgpu.rs's `tf_gpu_usage` and `tf_worker_usage`) for the metrics file.

Prometheus names follow dcgm-exporter's habits: one gauge per quantity, the GPU identified by
`gpu` (index), `UUID` and `modelName` labels, plus `Hostname`; a pod by `namespace` and `pod`.
A value the driver did not give is left out, never written as 0.
"""

import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.node import NodeView

HOSTNAME = socket.gethostname()

# name, help, value of a GPU
_GPU_GAUGES: tuple[tuple[str, str, Callable[[models.Gpu], float | None]], ...] = (
    ("tf_gpu_memory_total_bytes", "Memory of the GPU.", lambda g: g.memory_total),
    (
        "tf_gpu_memory_used_bytes",
        "Memory in use on the GPU (all processes).",
        lambda g: g.memory_used,
    ),
    ("tf_gpu_utilization_percent", "Share of time the GPU was busy.", lambda g: g.utilization),
    (
        "tf_gpu_memory_utilization_percent",
        "Share of time the GPU's memory was read or written.",
        lambda g: g.memory_utilization,
    ),
    ("tf_gpu_temperature_celsius", "GPU temperature.", lambda g: g.temperature_c),
    ("tf_gpu_power_watts", "GPU power draw.", lambda g: g.power_draw_w),
    ("tf_gpu_sm_clock_mhz", "SM clock.", lambda g: g.sm_clock_mhz),
    (
        "tf_gpu_boost_ratio",
        "Limited pods' GPU time is charged times this (boost correction; absent: none).",
        lambda g: g.boost,
    ),
    ("tf_gpu_pods", "Pods with limits on the GPU.", lambda g: g.pods),
    ("tf_gpu_workers", "Workers holding memory on the GPU.", lambda g: g.workers),
)
_POD_GAUGES: tuple[tuple[str, str, Callable[[models.PodGpu], float | None]], ...] = (
    ("tf_pod_memory_used_bytes", "Memory the pod holds on the GPU.", lambda g: g.memory_used),
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
        "tf_pod_utilization_percent",
        "SM utilization of the pod's workers on the GPU.",
        lambda g: g.utilization,
    ),
)
# The scheduler's time counters of a pod on a GPU (the limiter's region words).
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
)
_POD_LABELS = ["namespace", "pod", "gpu", "UUID", "Hostname"]
_WORKER_LABELS = ["namespace", "pod", "pid", "UUID", "Hostname"]


class ViewCollector(Collector):
    """Turns the newest view into gauges at each scrape (nothing is kept between scrapes, so a
    pod that is gone leaves no stale series)."""

    def __init__(self, view: Callable[[], NodeView]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        yield from self._gpus(view.gpus)
        yield from self._pods(view.pods)
        yield from self._workers(view.workers)
        info = GaugeMetricFamily(
            "tf_hypervisor_last_sample_timestamp_seconds",
            "When the daemon last read the regions.",
        )
        info.add_metric([], view.taken_at)
        yield info

    def _gpus(self, gpus: Iterable[models.Gpu]) -> Iterator[GaugeMetricFamily]:
        labels = ["gpu", "UUID", "modelName", "Hostname"]
        for name, text, value_of in _GPU_GAUGES:
            family = GaugeMetricFamily(name, text, labels=labels)
            for gpu in gpus:
                value = value_of(gpu)
                if value is not None:
                    family.add_metric(
                        [str(gpu.index), gpu.uuid or "", gpu.name or "", HOSTNAME], value
                    )
            yield family

    def _pods(self, pods: Iterable[models.Pod]) -> Iterator[Metric]:
        pods = list(pods)
        for name, text, value_of in _POD_GAUGES:
            family = GaugeMetricFamily(name, text, labels=_POD_LABELS)
            for pod in pods:
                for gpu in pod.gpus:
                    value = value_of(gpu)
                    if value is not None:
                        index = "" if gpu.index is None else str(gpu.index)
                        labels = [pod.namespace, pod.name, index, gpu.uuid, HOSTNAME]
                        family.add_metric(labels, value)
            yield family
        workers = GaugeMetricFamily(
            "tf_pod_workers", "Workers of the pod.", labels=["namespace", "pod", "Hostname"]
        )
        errors = GaugeMetricFamily(
            "tf_pod_region_error",
            "1 when the pod's region file cannot be read.",
            labels=["namespace", "pod", "Hostname"],
        )
        for pod in pods:
            workers.add_metric([pod.namespace, pod.name, HOSTNAME], pod.workers)
            errors.add_metric([pod.namespace, pod.name, HOSTNAME], 0 if pod.error is None else 1)
        yield workers
        yield errors
        frozen = GaugeMetricFamily(
            "tf_pod_frozen",
            "1 while the pod is frozen (its launches wait).",
            labels=["namespace", "pod", "Hostname"],
        )
        for pod in pods:
            frozen.add_metric([pod.namespace, pod.name, HOSTNAME], 1 if pod.frozen else 0)
        yield frozen
        for name, text, count_of in _POD_COUNTERS:
            counter = CounterMetricFamily(name, text, labels=_POD_LABELS)
            for pod in pods:
                for gpu in pod.gpus:
                    index = "" if gpu.index is None else str(gpu.index)
                    labels = [pod.namespace, pod.name, index, gpu.uuid, HOSTNAME]
                    counter.add_metric(labels, count_of(gpu))
            yield counter

    def _workers(self, workers: Iterable[models.Worker]) -> Iterator[GaugeMetricFamily]:
        memory = GaugeMetricFamily(
            "tf_worker_memory_used_bytes", "Memory a worker holds.", labels=_WORKER_LABELS
        )
        utilization = GaugeMetricFamily(
            "tf_worker_utilization_percent",
            "SM utilization of a worker.",
            labels=_WORKER_LABELS,
        )
        for worker in workers:
            pid = str(worker.host_pid or worker.pid)
            for gpu in worker.gpus:
                labels = [worker.namespace, worker.pod, pid, gpu.uuid, HOSTNAME]
                memory.add_metric(labels, gpu.memory_used)
                if gpu.utilization is not None:
                    utilization.add_metric(labels, gpu.utilization)
        yield memory
        yield utilization


def prometheus_registry(view: Callable[[], NodeView]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ViewCollector(view))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


# --- influx line protocol -------------------------------------------------------------------


def _escape_tag(text: str) -> str:
    return text.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def _line(measurement: str, tags: dict[str, str], fields: dict[str, float | int], ns: int) -> str:
    tag_text = "".join(f",{key}={_escape_tag(value)}" for key, value in tags.items() if value)
    field_text = ",".join(
        f"{key}={value}i" if isinstance(value, int) else f"{key}={float(value)!r}"
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
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
