"""The node's ResourceSlice kept current through the API server: written at start and whenever
the set of healthy GPUs changes, under one name per node (``{node}-gpu.vgpu.io``), so a
restarted daemon replaces its slice instead of adding one; other slices of this driver and node
(left by an older daemon) are deleted. Each change raises the pool's generation, as the
scheduler expects of a pool that changed. The slice is owned by its Node, as the kubelet's own
DRA helpers make it: a node deleted from the cluster takes its slice with it, and the scheduler
places no claim on GPUs that no longer exist.

An unhealthy GPU is tainted in the slice (slices.py). An API server without the DRADeviceTaints
feature gate drops taints silently, which would leave the GPU open to new claims: the slice it
stored is read back, and once its taints are found dropped the unhealthy GPUs are left out of
the slice instead, for as long as the daemon runs.

The slice is looked for again every RECHECK_S and written afresh when it is gone: a kubelet
wipes every ResourceSlice of its node when it starts, and a Node deleted and registered again
(a new UID) takes the old slice with it through its owner reference. Written only when the GPUs
changed, the slice stayed gone, and the node's GPUs could take no claim until the daemon
restarted.
"""

import logging
import time
from collections.abc import Iterable
from typing import Any

import httpx2
from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node

from vgpu_hypervisor.dra.claims import DRIVER
from vgpu_hypervisor.dra.inventory import NodeFacts
from vgpu_hypervisor.dra.kube import KubeError, ResourceSlice, api_error
from vgpu_hypervisor.dra.slices import node_slice, slice_name

log = logging.getLogger("vgpu_hypervisor.dra")

RECHECK_S = 10.0
"""How often the published slice is looked for (one GET)."""


class SlicePublisher:
    def __init__(self, client: Client, node: str, facts: NodeFacts) -> None:
        self._client = client
        self.node = node
        self.facts = facts
        self._published: frozenset[str] | None = None
        self._owner: list[OwnerReference] | None = None
        self.taints = True  # unhealthy GPUs tainted, until the API server drops taints
        self._checked = time.monotonic()  # when the slice was last written or found

    def publish(self, healthy: Iterable[str]) -> bool:
        """The slice with the GPUs ``healthy`` (UUIDs) written unless it says so already (and
        is still there, every RECHECK_S); whether it was written. KubeError (one line) when the
        API server refuses."""
        wanted = frozenset(healthy)
        try:
            if wanted == self._published and self._still_there():
                return False
            self._write(wanted)
        except ApiError as error:
            raise KubeError(f"ResourceSlice {slice_name(self.node)}: {api_error(error)}") from None
        except httpx2.HTTPError as error:
            raise KubeError(f"ResourceSlice {slice_name(self.node)}: {error}") from None
        self._published = wanted
        self._checked = time.monotonic()
        return True

    def _still_there(self) -> bool:
        """Whether the slice published is still in the API server (looked for every RECHECK_S;
        assumed meanwhile). Gone, its Node is read again: it may be a new one."""
        if time.monotonic() - self._checked < RECHECK_S:
            return True
        try:
            self._client.get(ResourceSlice, slice_name(self.node))
        except ApiError as error:
            if error.status.code != 404:
                raise
            log.warning(
                "ResourceSlice %s: gone (a kubelet restarted?): written again",
                slice_name(self.node),
            )
            self._owner = None
            return False
        self._checked = time.monotonic()
        return True

    def _write(self, healthy: frozenset[str]) -> None:
        stored = self._put(healthy)
        if self.taints and not _taints_kept(stored, len(self.facts.gpus) - len(healthy)):
            self.taints = False
            log.warning(
                "ResourceSlice %s: the API server drops device taints (feature gate "
                "DRADeviceTaints off): unhealthy GPUs are left out of the slice instead",
                slice_name(self.node),
            )
            self._put(healthy)

    def _put(self, healthy: frozenset[str]) -> Any:
        """The slice written (created, or replacing the node's one); the object as stored."""
        name = slice_name(self.node)
        existing = {
            one.metadata.name: one
            for one in self._client.list(
                ResourceSlice, fields={"spec.nodeName": self.node, "spec.driver": DRIVER}
            )
            if one.metadata is not None and one.metadata.name is not None
        }
        for other in sorted(set(existing) - {name}):
            self._client.delete(ResourceSlice, other)
            log.info("ResourceSlice %s deleted (not this daemon's name)", other)
        old = existing.get(name)
        generation = _generation(old) + 1 if old is not None else 1
        body = node_slice(self.node, self.facts, set(healthy), generation, taint=self.taints)
        version = old.metadata.resourceVersion if old and old.metadata is not None else None
        obj = ResourceSlice(
            apiVersion=body["apiVersion"],
            kind=body["kind"],
            metadata=ObjectMeta(
                name=name, resourceVersion=version, ownerReferences=self._node_owner()
            ),
            spec=body["spec"],
        )
        stored = self._client.create(obj) if old is None else self._client.replace(obj)
        log.info(
            "ResourceSlice %s: %d GPU(s), pool generation %d",
            name,
            len(body["spec"]["devices"]),
            generation,
        )
        return stored

    def _node_owner(self) -> list[OwnerReference] | None:
        """The Node as the slice's owner, read once; None (said once) when it cannot be read:
        the slice is then published without one and outlives a deleted Node."""
        if self._owner is None:
            try:
                node = self._client.get(Node, self.node)
            except ApiError as error:
                log.warning(
                    "ResourceSlice %s: published without its Node as owner (node %s: %s)",
                    slice_name(self.node),
                    self.node,
                    api_error(error),
                )
                self._owner = []
            else:
                uid = node.metadata.uid if node.metadata is not None else None
                self._owner = (
                    [
                        OwnerReference(
                            apiVersion="v1", kind="Node", name=self.node, uid=uid, controller=True
                        )
                    ]
                    if uid
                    else []
                )
        return self._owner or None

    def remove(self) -> None:
        """The slice deleted (the daemon stops serving claims on this node)."""
        try:
            self._client.delete(ResourceSlice, slice_name(self.node))
        except ApiError as error:
            if error.status.code != 404:
                raise KubeError(f"ResourceSlice: {api_error(error)}") from None
        self._published = None


def _taints_kept(stored: Any, unhealthy: int) -> bool:
    """Whether the stored slice still has the taints of its ``unhealthy`` devices."""
    devices = (stored.get("spec") or {}).get("devices") or []
    return sum(1 for one in devices if one.get("taints")) >= unhealthy


def _generation(obj: Any) -> int:
    pool = (obj.get("spec") or {}).get("pool") or {}
    generation = pool.get("generation", 0)
    return generation if isinstance(generation, int) else 0
