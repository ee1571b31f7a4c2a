"""Allocate's region step: the pod's region exists before its container starts.

The pod source usually made it already (from the pod's annotations); when Allocate comes
first, the region is made here through the PodStore (the one writer of regions) with the
limits of the pod's resource requests. The GPUs' lease files are made too, so the container
can mount the lease folder.
"""

import contextlib
from collections.abc import Mapping
from pathlib import Path

from vgpu_limiter.lease import DeviceLease
from vgpu_limiter.region import region_path

from vgpu_hypervisor.daemon.pods import Limits, PodConflict, PodStore
from vgpu_hypervisor.device_plugin.allocation import PreparePod
from vgpu_hypervisor.kubernetes.model import KubePod


def store_preparer(store: PodStore) -> PreparePod:
    """A PreparePod that creates missing regions in ``store``; the host folder of the pod."""

    def prepare(pod: KubePod, limits: Mapping[str, Limits]) -> Path:
        for uuid in limits:
            DeviceLease.open(store.base, uuid).close()
        # Made by the pod source already: its limits (annotations included) stand.
        with contextlib.suppress(PodConflict):
            store.create(pod.namespace, pod.name, limits)
        return region_path(store.base, pod.namespace, pod.name).parent

    return prepare
