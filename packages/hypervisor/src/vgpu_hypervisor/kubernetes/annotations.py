"""A pod's annotations and extended resources, resolved into one set of limits per GPU.

Annotations (vgpu.rs names): ``tensor-fusion.ai/vram-limit`` (a size), ``compute-limit``
(percent), ``tflops-limit`` (converted through PEAK_TFLOPS), ``compute-burst`` (percent),
``gpu-ids`` (indices or UUIDs), ``qos`` and ``vram-oversubscribe``. A limit annotation applies
to every GPU of the pod; ``<annotation>.<gpu>`` (an index or UUID) sets it for one GPU.
Resources (names settable): ``vgpu.io/gpu`` (count), ``vgpu.io/gpu-memory`` (units of the
device plugin's memory unit, 1 GiB unless set, per GPU) and ``vgpu.io/gpu-compute`` (percent
per GPU), summed over the pod's containers, which share the pod's one region.

Nothing here is silently dropped: a value that cannot be read, or two sources that disagree,
is a problem (one line naming the pod and the field). Where two sources disagree the lower
limit still applies, so a mistake never leaves a pod with less limited than either asked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from vgpu_common.units import format_size, parse_size

from vgpu_hypervisor.kubernetes.model import KubePod

PREFIX = "tensor-fusion.ai/"
VRAM_LIMIT = PREFIX + "vram-limit"
COMPUTE_LIMIT = PREFIX + "compute-limit"
TFLOPS_LIMIT = PREFIX + "tflops-limit"
COMPUTE_BURST = PREFIX + "compute-burst"
GPU_IDS = PREFIX + "gpu-ids"
QOS = PREFIX + "qos"
VRAM_OVERSUBSCRIBE = PREFIX + "vram-oversubscribe"
_PER_GPU = (VRAM_LIMIT, COMPUTE_LIMIT, TFLOPS_LIMIT, COMPUTE_BURST)
ANNOTATIONS = (*_PER_GPU, GPU_IDS, QOS, VRAM_OVERSUBSCRIBE)
QOS_LEVELS = ("low", "medium", "high", "critical")
MiB = 1 << 20

# Dense FP16/BF16 tensor-core peak TFLOPS (vendor data sheets, without sparsity), matched
# against the NVML name in this order: the first pattern found in the name wins.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("B200", 2250.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("H20", 148.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("A30", 165.0),
    ("A40", 150.0),
    ("A10", 125.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("RTX 4090", 165.0),
    ("V100", 125.0),
    ("T4", 65.0),
)

_UUID = re.compile(r"GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
_INDEX = re.compile(r"0|[1-9][0-9]{0,2}")
_NUMBER = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*")
_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


@dataclass(frozen=True)
class ResourceNames:
    gpu: str = "vgpu.io/gpu"
    memory: str = "vgpu.io/gpu-memory"
    compute: str = "vgpu.io/gpu-compute"
    # Bytes of one unit of the memory resource: the device plugin's (settable) unit.
    memory_unit: int = 1 << 30


DEFAULT_NAMES = ResourceNames()


@dataclass(frozen=True)
class NodeGpu:
    index: int
    uuid: str
    name: str


@dataclass(frozen=True)
class GpuLimits:
    """``memory`` bytes (None: no limit); ``compute`` and ``burst`` percent (None: none)."""

    memory: int | None = None
    compute: float | None = None
    burst: float | None = None


@dataclass(frozen=True)
class Resolution:
    """What a pod asks for: ``gpus`` by GPU UUID (empty when it asks for no vgpu share),
    ``problems`` one line each."""

    wants_gpu: bool
    gpus: Mapping[str, GpuLimits] = field(default_factory=dict)
    qos: str | None = None
    oversubscribe: bool = False
    problems: tuple[str, ...] = ()


def parse_percent(text: str) -> float:
    """A percentage from 1 to 100 ("30", "12.5", "30%"); ValueError otherwise."""
    match = _NUMBER.fullmatch(text.removesuffix("%"))
    value = float(match[1]) if match else math.nan
    if not 1 <= value <= 100:
        raise ValueError(f"expected a percentage from 1 to 100, got {text!r}")
    return round(value, 2)


def parse_tflops(text: str) -> float:
    match = _NUMBER.fullmatch(text)
    value = float(match[1]) if match else 0.0
    if not value > 0:
        raise ValueError(f"expected TFLOPS greater than 0, got {text!r}")
    return value


def parse_gpu_ids(text: str) -> tuple[str, ...]:
    """Comma-separated GPU indices or UUIDs, no repeats; ValueError otherwise."""
    ids = tuple(part.strip() for part in text.split(","))
    for gpu in ids:
        if not (_INDEX.fullmatch(gpu) or _UUID.fullmatch(gpu)):
            raise ValueError(f"expected GPU indices or UUIDs separated by commas, got {gpu!r}")
    if len({gpu.lower() for gpu in ids}) != len(ids):
        raise ValueError(f"a GPU is named twice in {text!r}")
    return ids


def parse_switch(text: str) -> bool:
    value = text.strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"expected true or false, got {text!r}")
    return value in _TRUE


def peak_tflops(name: str) -> float | None:
    """The peak TFLOPS of a GPU by its NVML name; None if the table has no such model."""
    return next((peak for pattern, peak in PEAK_TFLOPS if pattern in name), None)


def parse_quantity(text: str) -> int:
    """A resource quantity that must be a whole number (GPUs, memory units, percent)."""
    if not re.fullmatch(r"[0-9]{1,9}", text.strip()):
        raise ValueError(f"expected a whole number, got {text!r}")
    return int(text)


class _Problems:
    def __init__(self, pod: KubePod) -> None:
        self.pod = pod
        self.lines: list[str] = []

    def add(self, where: str, value: str, why: str) -> None:
        shown = value if len(value) <= 80 else value[:77] + "..."
        self.lines.append(f"pod {self.pod.key}: {where}={shown!r}: {why}")


def _match_gpu(key: str, gpus: Sequence[NodeGpu]) -> NodeGpu | None:
    if _INDEX.fullmatch(key):
        return next((gpu for gpu in gpus if gpu.index == int(key)), None)
    return next((gpu for gpu in gpus if gpu.uuid.lower() == key.lower()), None)


def _resources(pod: KubePod, names: ResourceNames, problems: _Problems) -> dict[str, int]:
    """The pod's vgpu resources summed over its containers."""
    totals: dict[str, int] = {}
    for container in pod.containers:
        for resource in (names.gpu, names.memory, names.compute):
            text = container.resources.get(resource)
            if text is None:
                continue
            try:
                totals[resource] = totals.get(resource, 0) + parse_quantity(text)
            except ValueError as error:
                problems.add(f"container {container.name} resource {resource}", text, str(error))
    return totals


def resolve(
    pod: KubePod,
    gpus: Sequence[NodeGpu],
    names: ResourceNames = DEFAULT_NAMES,
    assigned: Sequence[str] = (),
) -> Resolution:
    """The limits ``pod`` asks for on this node's ``gpus``. ``assigned``: the GPUs (indices or
    UUIDs) the device plugin gave it, used when it names none; else every GPU of the node
    (a container sees only those it was given, so the others are never charged)."""
    problems = _Problems(pod)
    ours = {key for key in pod.annotations if key.startswith(PREFIX)}
    resources = _resources(pod, names, problems)
    if not ours and not resources and not problems.lines:
        return Resolution(wants_gpu=False)
    chosen = _choose_gpus(
        pod, gpus, assigned=assigned, count=resources.get(names.gpu), names=names, problems=problems
    )
    compute_resource = resources.get(names.compute)
    if compute_resource is not None and not 1 <= compute_resource <= 100:
        problems.add(f"resource {names.compute}", str(compute_resource), "expected 1 to 100")
        compute_resource = None
    defaults = _gpu_values(pod.annotations, "", problems)
    limits = {
        gpu.uuid: _gpu_limits(
            pod,
            gpu,
            defaults=defaults,
            memory_units=resources.get(names.memory),
            compute_resource=compute_resource,
            names=names,
            problems=problems,
        )
        for gpu in chosen
    }
    _check_keys(pod, ours, chosen, problems)
    qos = pod.annotations.get(QOS)
    if qos is not None and qos.strip().lower() not in QOS_LEVELS:
        problems.add(QOS, qos, "expected low, medium, high or critical")
        qos = None
    oversubscribe = False
    if (text := pod.annotations.get(VRAM_OVERSUBSCRIBE)) is not None:
        try:
            oversubscribe = parse_switch(text)
        except ValueError as error:
            problems.add(VRAM_OVERSUBSCRIBE, text, str(error))
    return Resolution(
        wants_gpu=True,
        gpus=limits,
        qos=qos.strip().lower() if qos else None,
        oversubscribe=oversubscribe,
        problems=tuple(problems.lines),
    )


def _choose_gpus(
    pod: KubePod,
    gpus: Sequence[NodeGpu],
    *,
    assigned: Sequence[str],
    count: int | None,
    names: ResourceNames,
    problems: _Problems,
) -> list[NodeGpu]:
    """The GPUs of the pod: gpu-ids, else those assigned, else every GPU of the node."""
    ids_text = pod.annotations.get(GPU_IDS)
    wanted: tuple[str, ...] = tuple(assigned)
    if ids_text is not None:
        try:
            wanted = parse_gpu_ids(ids_text)
        except ValueError as error:
            problems.add(GPU_IDS, ids_text, str(error))
    if not wanted:
        return list(gpus)
    chosen = []
    for gpu_id in wanted:
        found = _match_gpu(gpu_id, gpus)
        if found is None:
            problems.add(GPU_IDS, ids_text or gpu_id, f"this node has no GPU {gpu_id}")
        else:
            chosen.append(found)
    if count is not None and ids_text is not None and count != len(wanted):
        problems.add(
            GPU_IDS, ids_text, f"names {len(wanted)} GPU(s) but resource {names.gpu} asks {count}"
        )
    return chosen


def _gpu_limits(
    pod: KubePod,
    gpu: NodeGpu,
    *,
    defaults: Mapping[str, float],
    memory_units: int | None,
    compute_resource: int | None,
    names: ResourceNames,
    problems: _Problems,
) -> GpuLimits:
    """One GPU's limits: pod-wide annotations, its own, and the resources, reconciled."""
    values = dict(defaults)
    for key in (str(gpu.index), gpu.uuid):
        values |= _gpu_values(pod.annotations, "." + key, problems)
    memory = values.get(VRAM_LIMIT)
    if memory_units is not None:
        from_resource = memory_units * names.memory_unit
        if memory is not None and memory != from_resource:
            problems.add(
                VRAM_LIMIT,
                format_size(int(memory)),
                f"contradicts resource {names.memory}={memory_units} "
                f"(units of {format_size(names.memory_unit)}); the lower applies",
            )
        memory = from_resource if memory is None else min(memory, from_resource)
    compute = _lower(values.get(COMPUTE_LIMIT), _from_tflops(gpu, values, problems))
    if compute_resource is not None:
        if compute is not None and compute != compute_resource:
            problems.add(
                COMPUTE_LIMIT,
                f"{compute:g}",
                f"contradicts resource {names.compute}={compute_resource}; the lower applies",
            )
        compute = _lower(compute, float(compute_resource))
    burst = values.get(COMPUTE_BURST)
    if burst is not None and compute is not None and burst < compute:
        problems.add(COMPUTE_BURST, f"{burst:g}", f"below the compute limit {compute:g} %")
    return GpuLimits(memory=None if memory is None else int(memory), compute=compute, burst=burst)


def _from_tflops(gpu: NodeGpu, values: Mapping[str, float], problems: _Problems) -> float | None:
    """tflops-limit as percent of this GPU's peak; a problem when it cannot be converted or
    when it disagrees with compute-limit."""
    tflops = values.get(TFLOPS_LIMIT)
    if tflops is None:
        return None
    peak = peak_tflops(gpu.name)
    if peak is None:
        why = f"GPU {gpu.index} ({gpu.name}) is not in the peak TFLOPS table"
        problems.add(TFLOPS_LIMIT, f"{tflops:g}", why)
        return None
    if tflops > peak:
        why = f"above GPU {gpu.index}'s peak of {peak:g} TFLOPS"
        problems.add(TFLOPS_LIMIT, f"{tflops:g}", why)
        return None
    converted = max(1.0, round(100 * tflops / peak, 2))
    compute = values.get(COMPUTE_LIMIT)
    if compute is not None and compute != converted:
        problems.add(
            TFLOPS_LIMIT,
            f"{tflops:g}",
            f"is {converted:g} % of GPU {gpu.index}, contradicting {COMPUTE_LIMIT}={compute:g}; "
            "the lower applies",
        )
    return converted


def _lower(first: float | None, second: float | None) -> float | None:
    if first is None or second is None:
        return second if first is None else first
    return min(first, second)


def _check_keys(pod: KubePod, ours: set[str], chosen: list[NodeGpu], problems: _Problems) -> None:
    """Unknown tensor-fusion.ai annotations, and per-GPU ones naming no GPU of the pod."""
    chosen_keys = {k.lower() for gpu in chosen for k in (str(gpu.index), gpu.uuid)}
    for key in sorted(ours):
        base, dot, suffix = key.removeprefix(PREFIX).partition(".")
        base = PREFIX + base
        if base not in ANNOTATIONS:
            problems.add(key, pod.annotations[key], "unknown annotation")
        elif dot and (base not in _PER_GPU or suffix.lower() not in chosen_keys):
            problems.add(key, pod.annotations[key], f"names no GPU of the pod ({suffix})")


def _gpu_values(
    annotations: Mapping[str, str], suffix: str, problems: _Problems
) -> dict[str, float]:
    """The limit annotations with ``suffix`` (pod-wide: ""), parsed; bad ones reported."""
    values: dict[str, float] = {}
    parsers: dict[str, Callable[[str], float]] = {
        VRAM_LIMIT: parse_size,  # an int: sizes stay exact
        COMPUTE_LIMIT: parse_percent,
        TFLOPS_LIMIT: parse_tflops,
        COMPUTE_BURST: parse_percent,
    }
    for name, parse in parsers.items():
        key = name + suffix
        text = annotations.get(key)
        if text is None:
            continue
        try:
            values[name] = parse(text)
        except ValueError as error:
            problems.add(key, text, str(error))
    return values
