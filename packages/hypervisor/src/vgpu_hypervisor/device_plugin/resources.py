"""What the device plugin advertises: three extended resources and their plugin devices.

A kubelet counts whole devices, so every unit a pod can ask for is one plugin device:

- the GPU resource (`vgpu.io/gpu`): ``shares`` devices per GPU, ``{uuid}-{k}``, so up to
  ``shares`` containers can hold one GPU at once;
- the memory resource (`vgpu.io/gpu-memory`): one device per ``memory_unit`` bytes of each
  GPU's memory, ``{uuid}-m{k}``;
- the compute resource (`vgpu.io/gpu-compute`): 100 devices per GPU (one per percent),
  ``{uuid}-c{k}``.

Memory and compute devices only count capacity: the kubelet picks them from any GPU, and the
pod's limits apply to the GPUs its GPU devices name (allocation.py), each GPU kept within what
it has by the plugin's own accounting (accounting.py).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from vgpu_hypervisor.kubernetes.annotations import Kind

KINDS: Final[tuple[Kind, ...]] = ("gpu", "memory", "compute")
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
COMPUTE_UNITS: Final = 100
# The kubelet reads a ListAndWatch message with gRPC's default 4 MiB limit; stay well below.
MAX_LIST_BYTES: Final = 3 << 20


class ResourceError(ValueError):
    """A resource setting or inventory the plugin cannot advertise; one line."""


@dataclass(frozen=True)
class Gpu:
    uuid: str
    memory_total: int  # bytes


def device_ids(kind: Kind, gpus: Sequence[Gpu], shares: int, memory_unit: int) -> list[str]:
    """The plugin devices of one resource, in GPU order."""
    ids: list[str] = []
    for gpu in gpus:
        if kind == "gpu":
            ids += [f"{gpu.uuid}-{k}" for k in range(shares)]
        elif kind == "memory":
            ids += [f"{gpu.uuid}-m{k}" for k in range(gpu.memory_total // memory_unit)]
        else:
            ids += [f"{gpu.uuid}-c{k}" for k in range(COMPUTE_UNITS)]
    return ids


def check_inventory(gpus: Sequence[Gpu], shares: int, memory_unit: int) -> None:
    """ResourceError when a resource's device list would not fit one kubelet message."""
    for kind in KINDS:
        ids = device_ids(kind, gpus, shares, memory_unit)
        size = sum(len(one) + len(UNHEALTHY) + 8 for one in ids)
        if size > MAX_LIST_BYTES:
            hint = "raise --gpu-memory-unit" if kind == "memory" else "lower --gpu-shares"
            raise ResourceError(
                f"{len(ids)} {kind} devices do not fit the kubelet's 4 MiB message: {hint}"
            )


def gpu_of(device_id: str) -> str:
    """The GPU UUID a plugin device belongs to (any kind)."""
    return device_id.rsplit("-", 1)[0]


def health_of(device_id: str, healthy: Mapping[str, bool]) -> str:
    return HEALTHY if healthy.get(gpu_of(device_id), False) else UNHEALTHY
