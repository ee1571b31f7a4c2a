"""The node's ResourceSlice (resource.k8s.io/v1): one pool named after the node, one device per
GPU, shared by several claims (allowMultipleAllocations), each claim consuming part of its
capacities:

- ``memory``: the GPU's bytes; a request is rounded up to whole MiB, 1 MiB at least; one that
  names none takes the whole GPU's;
- ``compute``: percent of the GPU's time, 1 to 100; one that names none takes 100.

So a claim that asks for no capacity gets the whole GPU to itself, as with the device plugin.
Attributes for CEL selectors, under the driver's domain: uuid, index, productName,
architecture, computeCapability, driverVersion and cudaVersion (versions as semver).

An unhealthy GPU is tainted ``gpu.vgpu.io/unhealthy`` (NoSchedule) where the API server keeps
device taints (the DRADeviceTaints feature gate), and left out of the slice otherwise.
"""

import re
from typing import Any, Final

from vgpu_hypervisor.dra.claims import COMPUTE, DRIVER, LEAST, MEMORY
from vgpu_hypervisor.dra.inventory import GpuFacts, NodeFacts
from vgpu_hypervisor.dra.quota import DEVICE_PREFIX

API_VERSION: Final = "resource.k8s.io/v1"
# An unhealthy GPU's taint: the scheduler places no new claim on it that does not tolerate it;
# claims prepared already stay, as with the device plugin (NoExecute would evict their pods).
UNHEALTHY_TAINT: Final = {"key": f"{DRIVER}/unhealthy", "effect": "NoSchedule"}
MiB: Final = 1 << 20


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def semver(text: str | None) -> str | None:
    """A driver's version as semver ("580.65.06" → "580.65.6", "13.0" → "13.0.0")."""
    parts = re.findall(r"[0-9]+", text or "")
    if not parts:
        return None
    numbers = [str(int(part)) for part in parts[:3]]
    return ".".join(numbers + ["0"] * (3 - len(numbers)))


def device(gpu: GpuFacts, facts: NodeFacts) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "productName": {"string": gpu.name},
    }
    if gpu.architecture:
        attributes["architecture"] = {"string": gpu.architecture}
    for key, value in (
        ("computeCapability", gpu.compute_capability),
        ("driverVersion", facts.driver_version),
        ("cudaVersion", facts.cuda_version),
    ):
        version = semver(value)
        if version is not None:
            attributes[key] = {"version": version}
    most = max(gpu.memory // MiB, 1) * MiB  # the largest request: whole MiB
    return {
        "name": f"{DEVICE_PREFIX}{gpu.index}",
        "attributes": attributes,
        "capacity": {
            MEMORY: {
                "value": str(gpu.memory),
                "requestPolicy": {
                    "default": str(most),
                    "validRange": {"min": str(LEAST[MEMORY]), "max": str(most), "step": str(MiB)},
                },
            },
            COMPUTE: {
                "value": "100",
                "requestPolicy": {
                    "default": "100",
                    "validRange": {"min": str(LEAST[COMPUTE]), "max": "100", "step": "1"},
                },
            },
        },
        "allowMultipleAllocations": True,
    }


def node_slice(
    node: str, facts: NodeFacts, healthy: set[str], generation: int, *, taint: bool = False
) -> dict[str, Any]:
    """The slice of ``node``: the GPUs whose UUID is in ``healthy``, and with ``taint`` the
    others too, tainted."""
    devices = []
    for gpu in facts.gpus:
        if gpu.uuid in healthy:
            devices.append(device(gpu, facts))
        elif taint:
            devices.append(device(gpu, facts) | {"taints": [dict(UNHEALTHY_TAINT)]})
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
