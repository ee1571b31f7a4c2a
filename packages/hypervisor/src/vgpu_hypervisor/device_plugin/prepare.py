"""Allocate's region step: the pod's region exists before its container starts.

The pod source usually made it already (from the pod's annotations); when Allocate comes
first, the region is made here through the PodStore (the one writer of regions) with the
limits of the pod's resource requests.
"""

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from vgpu_common.limits import GpuLimits
from vgpu_limiter.region import region_path

from vgpu_hypervisor.daemon.pods import PodConflict, PodStore
from vgpu_hypervisor.device_plugin.allocation import PreparePod
from vgpu_hypervisor.kubernetes.model import KubePod

# The pod source's assign(uid, gpus): the pod's limits on the GPUs Allocate gave it, resolved
# from its annotations and resources together and written through the store.
Assign = Callable[[str, Sequence[str]], None]


def store_preparer(store: PodStore, assign: Assign | None = None) -> PreparePod:
    """A PreparePod that creates missing regions in ``store``; the host folder of the pod.
    With ``assign`` (the pod source), the pod source sets the pod's limits on its GPUs first."""

    def prepare(
        pod: KubePod, limits: Mapping[str, GpuLimits]
    ) -> tuple[Path, Mapping[str, GpuLimits]]:
        if assign is not None:
            assign(pod.uid, list(limits))
        # Made by the pod source already: its limits (annotations included) stand.
        with contextlib.suppress(PodConflict):
            store.create(pod.namespace, pod.name, limits)
        folder = region_path(store.base, pod.namespace, pod.name).parent
        return folder, _held(store, pod, limits)

    return prepare


def _held(store: PodStore, pod: KubePod, asked: Mapping[str, GpuLimits]) -> Mapping[str, GpuLimits]:
    """The limits the region holds for the GPUs asked about, so that the container's env says
    what the region says (the limiter warns when the two differ); those asked where the region
    has no entry for a GPU, or one whose words no limits have."""
    devices = {d.uuid.lower(): d for d in store.get(pod.namespace, pod.name).devices}
    held: dict[str, GpuLimits] = {}
    for uuid, wanted in asked.items():
        device = devices.get(uuid.lower())
        try:
            held[uuid] = wanted if device is None else device.limits.value
        except ValueError:  # a tenant's words
            held[uuid] = wanted
    return held
