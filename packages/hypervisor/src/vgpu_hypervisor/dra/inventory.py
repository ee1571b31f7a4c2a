"""What the node's ResourceSlice says of each GPU, read once at start: the sample's index, UUID,
name and memory, and from NVML the minor number, compute capability and architecture, with the
driver's and CUDA's versions. A fact the driver does not give is left out of the slice."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from vgpu_hypervisor.gpu import NodeSnapshot, NotAvailable, nvml
from vgpu_hypervisor.gpu.backend import BackendInfo

# nvmlDeviceArchitecture_t values (nvml.h NVML_DEVICE_ARCH_*).
ARCHITECTURES: Final = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
}


@dataclass(frozen=True)
class GpuFacts:
    index: int
    uuid: str
    name: str
    memory: int  # bytes
    minor: int | None = None
    compute_capability: str | None = None  # "9.0"
    architecture: str | None = None


@dataclass(frozen=True)
class NodeFacts:
    gpus: tuple[GpuFacts, ...]
    driver_version: str | None = None
    cuda_version: str | None = None


def _known(value: object) -> str | None:
    return value if isinstance(value, str) else None


def read_facts(snapshot: NodeSnapshot, backend: BackendInfo) -> NodeFacts:
    """The GPUs of the sample whose UUID and memory it read, with what NVML adds."""
    gpus = []
    with nvml.LOCK:
        for device in snapshot.devices:
            if not isinstance(device.uuid, str) or not isinstance(device.memory_total, int):
                continue
            handle = nvml.device_handle(device.index)
            minor = capability = architecture = None
            if not isinstance(handle, NotAvailable):
                found = nvml.device_minor(handle)
                minor = found if isinstance(found, int) else None
                capability = _known(nvml.device_compute_capability(handle))
                code = nvml.device_architecture(handle)
                architecture = ARCHITECTURES.get(code) if isinstance(code, int) else None
            gpus.append(
                GpuFacts(
                    device.index,
                    device.uuid,
                    _known(device.name) or "",
                    device.memory_total,
                    minor,
                    capability,
                    architecture,
                )
            )
    return NodeFacts(tuple(gpus), _known(backend.driver_version), _known(backend.cuda_version))


def minors(facts: Sequence[GpuFacts]) -> dict[str, int]:
    return {gpu.uuid: gpu.minor for gpu in facts if gpu.minor is not None}
