"""Per-GPU accounting: what each GPU has committed to pods, where a pod's GPU shares should go
(GetPreferredAllocation) and the check made when a pod is bound to its allocation.

The kubelet counts the memory and compute resources for the whole node, and any share of the
GPU resource is as good as another to it; so without this, one GPU could be promised more
memory than it has, and a pod asking for two GPUs could get two shares of one. The plugin
keeps, per GPU, what it charged each pod there:

- a pod's charge on a GPU is its ceiling there as the one resolver gives it
  (kubernetes/resolver.py): the memory and compute its resources ask for, else the defaults
  (``default_gpu_memory``, ``default_gpu_compute``), else the whole GPU. Annotations that
  lower its limits do not lower the charge (the tenant may remove them again); an admin's
  change through the API does not change it either (the admin oversees the node);
- a pod is charged once per GPU (its containers share one region), when the binder learns
  that the kubelet gave it a share of that GPU (binding.py: Allocate does not know the pod),
  and only if the GPU still holds the charge: otherwise the binding is refused (no region is
  linked, the pod gets an event);
- a charge is released when its pod has ended (Succeeded or Failed) or left the node, as the
  kubelet frees its devices then.

The charges are kept in ``{base}/.device-plugin/charges.json`` (a folder only the daemon
writes, as the pod source's book), so a restarted daemon still counts the pods the kubelet's
own checkpoint still holds devices for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from vgpu_common.limits import WHOLE_GPU, format_percent, format_size, hundredths_to_percent

from vgpu_hypervisor.daemon.cluster import Charge
from vgpu_hypervisor.daemon.private_file import PrivateFile
from vgpu_hypervisor.device_plugin.resources import Gpu, gpu_of
from vgpu_hypervisor.kubernetes.annotations import NodeGpu, ResourceNames
from vgpu_hypervisor.kubernetes.model import KubePod
from vgpu_hypervisor.kubernetes.resolver import resolve

log = logging.getLogger("vgpu_hypervisor.device_plugin")
Placement = Literal["binpack", "spread"]
FOLDER: Final = ".device-plugin"
FILE: Final = "charges.json"
# Pods of this node still holding their devices, by UID; None while that is not known yet
# (the pod source has not listed the pods): nothing is released then.
LivePods = Callable[[], Collection[str] | None]


class DoesNotFit(Exception):
    """A GPU cannot hold what a pod asks of it; one line saying why."""


def shown(charge: Charge) -> str:
    """A charge in words: "8 GiB and 30 %"."""
    percent = format_percent(hundredths_to_percent(charge.compute))
    return f"{format_size(charge.memory)} and {percent}"


def pod_asks(pod: KubePod, gpus: Sequence[NodeGpu], names: ResourceNames) -> dict[str, Charge]:
    """What ``pod`` would be charged on each of ``gpus`` (by UUID), from the resolver's
    ceilings; a GPU whose memory is unknown is left out (it is not accounted)."""
    found = resolve(pod, gpus, names, assigned=[gpu.uuid for gpu in gpus])
    asks: dict[str, Charge] = {}
    for gpu in gpus:
        ceiling = found.ceilings.get(gpu.uuid)
        if ceiling is None or ceiling.memory is None or ceiling.compute is None:
            continue
        memory = ceiling.memory.value
        if memory is None:
            continue
        compute = WHOLE_GPU if ceiling.compute.value is None else ceiling.compute.value
        asks[gpu.uuid] = Charge(memory, compute)
    return asks


def largest(asks: Sequence[Mapping[str, Charge]]) -> dict[str, Charge]:
    """Per GPU, the most any of ``asks`` needs there (memory and compute apart); a GPU one of
    them has no ask for is left out."""
    common = set.intersection(*(set(ask) for ask in asks)) if asks else set()
    return {
        uuid: Charge(max(a[uuid].memory for a in asks), max(a[uuid].compute for a in asks))
        for uuid in common
    }


def _share_number(device_id: str) -> tuple[int, str]:
    number = device_id.rsplit("-", 1)[-1]
    return (int(number), device_id) if number.isdigit() else (-1, device_id)


def place(
    free: Mapping[str, Charge],
    asks: Mapping[str, Charge],
    available: Collection[str],
    must_include: Collection[str],
    *,
    size: int,
    policy: Placement,
) -> list[str] | None:
    """The placement rule: ``size`` GPU devices out of ``available``, ``must_include`` among
    them, each on another GPU, every GPU added holding the pod's ask there (``asks``) in what
    it has left (``free``). Of the GPUs that hold it, binpack takes those with the least left
    after the charge (memory first, then compute), spread those with the most; then by UUID.
    A GPU's lowest-numbered available share is taken. None when no such placement exists.
    The GPUs of ``must_include`` (devices the kubelet reuses, already the pod's) are taken as
    they are."""
    if len(must_include) > size:
        return None
    required = {gpu_of(one) for one in must_include}
    if len(required) < len(must_include):
        return None
    shares: dict[str, list[str]] = {}
    for one in available:
        shares.setdefault(gpu_of(one), []).append(one)
    fitting = []
    for uuid in shares.keys() - required:
        ask, left = asks.get(uuid), free.get(uuid)
        if ask is not None and left is not None and left.holds(ask):
            after = left - ask
            fitting.append(((after.memory, after.compute), uuid))
    if policy == "spread":
        fitting.sort(key=lambda item: ((-item[0][0], -item[0][1]), item[1]))
    else:
        fitting.sort()
    wanted = size - len(must_include)
    if len(fitting) < wanted:
        return None
    chosen = [min(shares[uuid], key=_share_number) for _, uuid in fitting[:wanted]]
    return [*sorted(must_include), *chosen]


# The least any pod is charged on a GPU: one with no memory or no time left holds no pod.
ANY_POD: Final = Charge(1, 1)


def place_unknown(
    free: Mapping[str, Charge],
    available: Collection[str],
    must_include: Collection[str],
    *,
    size: int,
) -> list[str] | None:
    """The placement for a pod whose asks are not known (the pod source does not show it
    yet): ``place`` with the least any pod asks on every GPU, so each share on another GPU
    with room left, those with the most room first whatever the policy: binpack's GPUs with
    the least left are the likeliest not to hold the pod, which the binding then refuses once
    the pod is known."""
    asks = dict.fromkeys(free, ANY_POD)
    return place(free, asks, available, must_include, size=size, policy="spread")


@dataclass(frozen=True)
class _Charged:
    key: str  # namespace/name, for messages
    gpus: Mapping[str, Charge]


class Ledger:
    """What each GPU of the plugin's inventory has committed, by pod. Thread-safe."""

    def __init__(
        self, gpus: Sequence[Gpu], folder: Path | None = None, live: LivePods | None = None
    ) -> None:
        """``folder``: where the charges are kept (None: in memory only); ``live``: the pods
        still holding their devices (None: none is ever released)."""
        self.capacity = {gpu.uuid: Charge(gpu.memory_total, WHOLE_GPU) for gpu in gpus}
        self._file = None if folder is None else PrivateFile(folder, FILE)
        self._live = live
        self._lock = threading.Lock()
        self._pods: dict[str, _Charged] = self._load()

    def committed(self) -> dict[str, Charge]:
        """Per GPU, the sum of its pods' charges."""
        with self._lock:
            self._release_gone()
            return self._committed(None)

    def free(self) -> dict[str, Charge]:
        """Per GPU, what is left of it."""
        with self._lock:
            self._release_gone()
            return self._free(None)

    def charged(self, uid: str) -> Mapping[str, Charge]:
        with self._lock:
            found = self._pods.get(uid)
            return dict(found.gpus) if found is not None else {}

    def charge(self, uid: str, key: str, asks: Mapping[str, Charge]) -> tuple[str, ...]:
        """Charge pod ``uid`` its ``asks`` on GPUs it has no charge on yet, all or none; the
        GPUs charged now. DoesNotFit (naming the first GPU, what it asks and what the GPU has
        committed) when one cannot hold it."""
        with self._lock:
            self._release_gone()
            before = self._pods.get(uid)
            held = dict(before.gpus) if before is not None else {}
            new = {uuid: ask for uuid, ask in asks.items() if uuid not in held}
            free = self._free(uid)
            for uuid, ask in sorted(new.items()):
                left = free.get(uuid)
                if left is not None and not left.holds(ask):
                    raise DoesNotFit(self._why(key, uuid, ask, uid))
            if new:
                self._pods[uid] = _Charged(key, {**held, **new})
                self._save()
            return tuple(sorted(new))

    # Under the lock

    def _committed(self, excluding: str | None) -> dict[str, Charge]:
        totals = dict.fromkeys(self.capacity, Charge(0, 0))
        for uid, charged in self._pods.items():
            if uid == excluding:
                continue
            for uuid, one in charged.gpus.items():
                if uuid in totals:
                    totals[uuid] += one
        return totals

    def _free(self, excluding: str | None) -> dict[str, Charge]:
        committed = self._committed(excluding)
        return {uuid: self.capacity[uuid] - committed[uuid] for uuid in self.capacity}

    def _why(self, key: str, uuid: str, ask: Charge, uid: str) -> str:
        committed = self._committed(uid)[uuid]
        holders = sum(1 for other, c in self._pods.items() if other != uid and uuid in c.gpus)
        capacity = self.capacity[uuid]
        return (
            f"pod {key}: GPU {uuid} cannot hold it: it asks {shown(ask)} there, and "
            f"{shown(committed)} of the GPU's {shown(capacity)} are committed to {holders} "
            "other pod(s)"
        )

    def _release_gone(self) -> None:
        live = self._live() if self._live is not None else None
        if live is None:
            return
        gone = [uid for uid in self._pods if uid not in live]
        for uid in gone:
            log.info("pod %s ended or left the node: its GPU charges are released",
                     self._pods.pop(uid).key)  # fmt: skip
        if gone:
            self._save()

    def _load(self) -> dict[str, _Charged]:
        document = self._file.load() if self._file is not None else None
        if document is None:
            return {}
        try:
            return _decode(document)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("%s: cannot read: %s; starting afresh", FILE, error)
            return {}

    def _save(self) -> None:
        if self._file is not None:
            self._file.save(_encode(self._pods))


def _encode(pods: Mapping[str, _Charged]) -> dict[str, Any]:
    return {
        "version": 1,
        "pods": [
            {
                "uid": uid,
                "pod": charged.key,
                "gpus": {u: [c.memory, c.compute] for u, c in sorted(charged.gpus.items())},
            }
            for uid, charged in sorted(pods.items())
        ],
    }


def _decode(document: Any) -> dict[str, _Charged]:
    if document.get("version") != 1:
        raise ValueError(f"version {document.get('version')!r}, this daemon reads version 1")
    pods = {}
    for pod in document["pods"]:
        gpus = {}
        for uuid, (memory, compute) in pod["gpus"].items():
            gpus[str(uuid)] = Charge(int(memory), int(compute))
        pods[str(pod["uid"])] = _Charged(str(pod["pod"]), gpus)
    return pods
