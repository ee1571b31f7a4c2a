"""What a pod may write: the vgpu.rs annotation names, the resource names, and their parsers.

Annotations (vgpu.rs names): ``tensor-fusion.ai/vram-limit`` (a size), ``compute-limit``
(percent), ``tflops-limit`` (converted through PEAK_TFLOPS), ``compute-burst`` (percent),
``gpu-ids`` (indices or UUIDs), ``qos`` and ``vram-oversubscribe``. A limit annotation applies
to every GPU of the pod; ``<annotation>.<gpu>`` (an index or UUID) sets it for one GPU.
Resources (names settable): ``vgpu.io/gpu`` (count), ``vgpu.io/gpu-memory`` (units of the
device plugin's memory unit, 1 GiB unless set, per GPU) and ``vgpu.io/gpu-compute`` (percent
per GPU). resolver.py turns them into a pod's limits: resources the ceiling, annotations lower.

The values are read with vgpu_common.limits' parsers, the API's and the CLI's: every one
gives a value in range or a ValueError that says what was expected, so a value that cannot be
read is a problem line naming pod and field, never a silently dropped limit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from vgpu_common.limits import names_gpu, parse_gpu_key, parse_percent, parse_size

PREFIX = "tensor-fusion.ai/"
VRAM_LIMIT = PREFIX + "vram-limit"
COMPUTE_LIMIT = PREFIX + "compute-limit"
TFLOPS_LIMIT = PREFIX + "tflops-limit"
COMPUTE_BURST = PREFIX + "compute-burst"
GPU_IDS = PREFIX + "gpu-ids"
QOS = PREFIX + "qos"
VRAM_OVERSUBSCRIBE = PREFIX + "vram-oversubscribe"
PER_GPU = (VRAM_LIMIT, COMPUTE_LIMIT, TFLOPS_LIMIT, COMPUTE_BURST)
ANNOTATIONS = (*PER_GPU, GPU_IDS, QOS, VRAM_OVERSUBSCRIBE)

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

_NUMBER = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*")
Kind = Literal["gpu", "memory", "compute"]


@dataclass(frozen=True)
class ResourceNames:
    """The extended resources a pod asks for (the settings name them), and what a pod asking
    for the GPU resource gets where it asks for no memory or no compute, for the pod source and
    the device plugin alike."""

    gpu: str = "vgpu.io/gpu"
    memory: str = "vgpu.io/gpu-memory"
    compute: str = "vgpu.io/gpu-compute"
    # Bytes of one unit of the memory resource: the device plugin's (settable) unit.
    memory_unit: int = 1 << 30
    # The default_gpu_memory and default_gpu_compute settings: bytes (at most the GPU's) and
    # hundredths of a percent; None: the whole GPU.
    default_memory: int | None = None
    default_compute: int | None = None

    def of(self, kind: Kind) -> str:
        name: str = getattr(self, kind)
        return name


DEFAULT_NAMES = ResourceNames()


@dataclass(frozen=True)
class NodeGpu:
    index: int
    uuid: str
    name: str
    memory_total: int | None = None  # bytes: the ceiling of a pod that asks for the whole GPU


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
        try:
            parse_gpu_key(gpu)
        except ValueError:
            raise ValueError(
                f"expected GPU indices or UUIDs separated by commas, got {gpu!r}"
            ) from None
    if len({gpu.lower() for gpu in ids}) != len(ids):
        raise ValueError(f"a GPU is named twice in {text!r}")
    return ids


def peak_tflops(name: str) -> float | None:
    """The peak TFLOPS of a GPU by its NVML name; None if the table has no such model."""
    return next((peak for pattern, peak in PEAK_TFLOPS if pattern in name), None)


# Reading a pod's annotations

Problem = Callable[[str, str, str], None]  # (where, value, why): one line about the pod


@dataclass(frozen=True)
class Asked:
    """One limit annotation as read: its value (bytes, hundredths of a percent or TFLOPS) and
    where it came from, so that a refusal names the annotation and the text the pod wrote."""

    value: float
    key: str
    text: str


_PARSERS: dict[str, Callable[[str], float]] = {
    VRAM_LIMIT: parse_size,  # an int: sizes stay exact
    COMPUTE_LIMIT: parse_percent,
    TFLOPS_LIMIT: parse_tflops,
    COMPUTE_BURST: parse_percent,
}


def limit_values(annotations: Mapping[str, str], suffix: str, problem: Problem) -> dict[str, Asked]:
    """The limit annotations with ``suffix`` ("" for the pod-wide ones, ".<gpu>" for one GPU's)
    by annotation name, parsed; one that cannot be read is a problem and left out."""
    values: dict[str, Asked] = {}
    for name, parse in _PARSERS.items():
        key = name + suffix
        text = annotations.get(key)
        if text is None:
            continue
        try:
            values[name] = Asked(parse(text), key, text)
        except ValueError as error:
            problem(key, text, str(error))
    return values


def match_gpu(key: str, gpus: Sequence[NodeGpu]) -> NodeGpu | None:
    """The GPU an index or a UUID (any case) names; None when this node has none such."""
    return next((gpu for gpu in gpus if names_gpu(key, gpu.index, gpu.uuid)), None)


def check_keys(annotations: Mapping[str, str], chosen: Sequence[NodeGpu], problem: Problem) -> None:
    """Unknown tensor-fusion.ai annotations, and per-GPU ones naming no GPU of the pod."""
    chosen_keys = {k.lower() for gpu in chosen for k in (str(gpu.index), gpu.uuid)}
    for key in sorted(k for k in annotations if k.startswith(PREFIX)):
        base, dot, suffix = key.removeprefix(PREFIX).partition(".")
        base = PREFIX + base
        if base not in ANNOTATIONS:
            problem(key, annotations[key], "unknown annotation")
        elif dot and (base not in PER_GPU or suffix.lower() not in chosen_keys):
            problem(key, annotations[key], f"names no GPU of the pod ({suffix})")
