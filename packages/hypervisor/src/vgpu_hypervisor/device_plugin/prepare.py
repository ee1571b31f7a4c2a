"""Allocate's region step: the pod's region exists, with an entry for every GPU Allocate gave,
before Allocate answers and so before its container starts.

With the pod source, ``assign`` makes it (from the pod's annotations and resources, on the
GPUs given and no others: the pod source waits for them); without a pod source, or where
``assign`` made none, the region is made here through
the PodStore (the one writer of regions) with the limits and the owner the resolver gives the
pod. The container's environment carries no limit (the region is the truth, and the daemon
changes it there live), so a region that cannot be made or lacks a GPU fails the Allocate: the
kubelet does not start a container that would find no limit.
"""

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from vgpu_common.limits import GpuLimits
from vgpu_limiter.region import region_path

from vgpu_hypervisor.daemon.pods import PodConflict, PodError, PodStore
from vgpu_hypervisor.device_plugin.allocation import PreparePod
from vgpu_hypervisor.kubernetes.model import KubePod, UserGroup

# The pod source's assign(uid, gpus): the pod's limits on the GPUs Allocate gave it, resolved
# from its annotations and resources together and written through the store.
Assign = Callable[[str, Sequence[str]], None]


def store_preparer(store: PodStore, assign: Assign | None = None) -> PreparePod:
    """A PreparePod that creates missing regions in ``store``; the host folder of the pod.
    With ``assign`` (the pod source), the pod source sets the pod's limits on its GPUs first."""

    def prepare(
        pod: KubePod, limits: Mapping[str, GpuLimits], owner: UserGroup
    ) -> tuple[Path, Mapping[str, GpuLimits]]:
        if assign is not None:
            assign(pod.uid, list(limits))
        # Made by the pod source already: its limits (annotations included) stand.
        with contextlib.suppress(PodConflict):
            store.create(pod.namespace, pod.name, limits, owner=owner.user, group=owner.group)
        held = _held(store, pod, limits)
        missing = {uuid: wanted for uuid, wanted in limits.items() if uuid not in held}
        if missing:  # a region made before for other GPUs: these get the resolver's limits
            store.update(pod.namespace, pod.name, missing, by_admin=False)
            held = _held(store, pod, limits)
        if len(held) < len(limits):
            absent = ", ".join(sorted(uuid for uuid in limits if uuid not in held))
            raise PodError(f"its region has no entry for GPU {absent}")
        folder = region_path(store.base, pod.namespace, pod.name).parent
        return folder, held

    return prepare


def _held(store: PodStore, pod: KubePod, asked: Mapping[str, GpuLimits]) -> dict[str, GpuLimits]:
    """The limits the region holds for the GPUs asked about that it has an entry for (what the
    container's processes will find; the resolver's for an entry whose words hold no limits, a
    tenant's); PodError when the region is missing or unreadable."""
    record = store.get(pod.namespace, pod.name)
    if record.error is not None:
        raise PodError(record.error)
    devices = {d.uuid.lower(): d for d in record.devices}
    held: dict[str, GpuLimits] = {}
    for uuid, wanted in asked.items():
        device = devices.get(uuid.lower())
        if device is None:
            continue
        try:
            held[uuid] = device.limits.value
        except ValueError:  # a tenant's words
            held[uuid] = wanted
    return held
