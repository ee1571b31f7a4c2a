"""NodePrepareResources and NodeUnprepareResources of one claim.

Prepare reads the claim (its allocation and the pod it is reserved for), the pod (its
security context: the region's owner) and the pod's other claims (those of this driver count
for the owner too) from the API server, records the claim in the checkpoint, gives the pod's
region the quota of all its prepared claims through the PodStore (the one writer of regions,
as for the device plugin and `pods create`) and writes the claim's CDI spec. A claim prepared
before (by this daemon or an earlier one) is answered from the checkpoint, its region and spec
made again where they went missing.

Unprepare lowers the pod's quota to its other claims, or, for its last one, deletes the region,
refusing while a process still uses it (the kubelet asks again); then the spec and the record
go. A region deleted already (through the API, or by the pod source) is not made again. A claim
not prepared here is unprepared already.
"""

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from vgpu_common.limits import GpuLimits, Qos

from vgpu_hypervisor.daemon.pods import PodNotFound, PodStore
from vgpu_hypervisor.device_plugin.allocation import Layout
from vgpu_hypervisor.dra import cdi
from vgpu_hypervisor.dra.checkpoint import Checkpoint, Prepared
from vgpu_hypervisor.dra.claims import Claim, ClaimError, Share, of_driver, parse_claim
from vgpu_hypervisor.dra.config import canonical
from vgpu_hypervisor.dra.quota import RELEASED, device_name, gpu_of, pod_quota
from vgpu_hypervisor.kubernetes.annotations import NodeGpu
from vgpu_hypervisor.kubernetes.model import KubePod
from vgpu_hypervisor.kubernetes.resolver import region_owner

log = logging.getLogger("vgpu_hypervisor.dra")


class ClaimSource(Protocol):
    """The API server, as Prepare reads it; ClaimError (one line) when it cannot."""

    def claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...

    def pod(self, namespace: str, name: str) -> KubePod: ...


@dataclass(frozen=True)
class PreparedDevice:
    share: Share
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class NodeConfig:
    layout: Layout  # the libraries, base path and device files, as the device plugin's
    pool: str  # the node's name: its ResourceSlice's pool
    gpus: tuple[NodeGpu, ...]
    minors: Mapping[str, int]  # GPU UUID → N of /dev/nvidiaN
    cdi_dir: Path = cdi.DEFAULT_FOLDER
    # Where NVIDIA's CDI spec may be (the driver's libraries for the containers): none, the
    # NVIDIA container runtime gives them.
    nvidia_cdi_dirs: tuple[Path, ...] = ()


class Preparer:
    def __init__(self, config: NodeConfig, store: PodStore, source: ClaimSource) -> None:
        self.config = config
        self._store = store
        self._source = source
        self._gpus = {device_name(gpu): gpu for gpu in config.gpus}
        self._checkpoint = Checkpoint(store.base)
        self._lock = threading.Lock()
        # Set by the daemon when a pod source runs: the UID of the pod it made the region of a
        # namespace and name for (a device-plugin pod's), None where it made none.
        self.region_made_for: Callable[[str, str], str | None] = lambda namespace, name: None
        # Set by the daemon when a pod source runs: called with a pod's UID, outside the lock,
        # after one of its claims left while others stay, so that the source writes its
        # limits again on a GPU the device plugin gave the pod too, which the claim's release
        # (RELEASED) took from it.
        self.claim_left: Callable[[str], object] = lambda pod_uid: None

    def prepared(self) -> dict[str, Claim]:
        with self._lock:
            return {uid: one.claim for uid, one in self._checkpoint.claims.items()}

    def pod_gpus(self, pod_uid: str) -> set[str]:
        """The UUIDs of the GPUs the pod's prepared claims hold (recorded ones, kept across
        restarts): the pod source writes no annotation over them (a pod of both the device
        plugin and a claim). Read from a copy without the lock, which Prepare holds while it
        reads the API server: the pod source must not wait on that."""
        claims = [one.claim for one in tuple(self._checkpoint.claims.values())]
        return {
            gpu.uuid
            for claim in claims
            if claim.pod_uid == pod_uid
            for share in claim.shares
            if (gpu := self._gpus.get(share.device)) is not None
        }

    def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        """The claim's devices and their CDI IDs; ClaimError, ConfigError or PodError."""
        with self._lock:
            known = self._checkpoint.claims.get(uid)
            joining = known is None
            if known is None:
                known = self._admit(parse_claim(self._source.claim(namespace, name), uid))
            claim = known.claim
            # Recorded once its pod's region holds it: a claim the region refuses is not
            # kept, so the kubelet's next try checks it afresh rather than fail the same way.
            self._apply(claim.pod_uid, known, joining=claim if joining else None)
            if joining:
                self._record(known)
            gpus = [gpu_of(claim, s, self.config.pool, self._gpus) for s in claim.shares]
            spec, ids = cdi.claim_spec(
                self.config.layout,
                claim.uid,
                claim.namespace,
                claim.pod,
                [
                    cdi.SpecGpu(
                        device_name(gpu), gpu.uuid, gpu.index, self.config.minors.get(gpu.uuid)
                    )
                    for gpu in gpus
                ],
                nvidia=cdi.nvidia_devices(self.config.nvidia_cdi_dirs),
            )
            cdi.write_spec(self.config.cdi_dir, claim.uid, spec)
            return [PreparedDevice(share, tuple(ids[share.device])) for share in claim.shares]

    def _admit(self, claim: Claim) -> Prepared:
        """The claim checked against its pod and, with the pod's other claims, its quota."""
        pod = self._source.pod(claim.namespace, claim.pod)
        if pod.uid != claim.pod_uid:
            raise ClaimError(
                f"claim {claim.namespace}/{claim.name}: reserved for pod {claim.pod} UID "
                f"{claim.pod_uid}, but that pod is UID {pod.uid}"
            )
        pod_quota([*self._claims_of(claim.pod_uid), claim], self.config.pool, self._gpus)
        # Kept (the checkpoint) as the driver reads them, not as the tenant wrote them: padded
        # to the API server's bounds, a few claims' parameters made the checkpoint too large
        # to read back, and a restarted daemon forgot every claim (config.canonical).
        where = f"claim {claim.namespace}/{claim.name}"
        parameters = tuple((requests, canonical(p, where)) for requests, p in claim.parameters)
        recorded = self._recorded_of(claim.pod_uid)
        # A claim of the pod recorded before says the owner it was given with all the pod's
        # claims in view: nothing more to read (under the node's lock) for the second claim on.
        owner = (
            recorded[0].owner
            if recorded
            else region_owner(pod, claims=self._served_claims(pod, claim))
        )
        return Prepared(replace(claim, parameters=parameters), owner)

    def _served_claims(self, pod: KubePod, claim: Claim) -> set[str]:
        """The pod's ResourceClaims this driver serves, ``claim`` (its first prepared) among
        them. The containers of each open the pod's one region, so its owner is theirs all,
        whichever claim comes first and whether the kubelet sends them in one request or, after
        its restart, apart. The others it names are read. One that cannot be read, or is not
        allocated yet, fails the Prepare (the kubelet asks again): the owner is set once, with
        the region."""
        served = {claim.name}
        for name in sorted(set(pod.claim_objects.values()) - served):
            try:
                ours = of_driver(self._source.claim(claim.namespace, name))
            except ClaimError as error:
                raise ClaimError(f"pod {claim.pod}: its region's owner: {error}") from None
            if ours:
                served.add(name)
        return served

    def _record(self, prepared: Prepared) -> None:
        claim = prepared.claim
        self._checkpoint.claims[claim.uid] = prepared
        self._checkpoint.save()
        log.info(
            "claim %s/%s of pod %s prepared: %s",
            claim.namespace,
            claim.name,
            claim.pod,
            ", ".join(f"{s.device} (memory {s.memory}, compute {s.compute})" for s in claim.shares),
        )

    def _recorded_of(self, pod_uid: str, leaving: str | None = None) -> list[Prepared]:
        return [
            one
            for uid, one in self._checkpoint.claims.items()
            if one.claim.pod_uid == pod_uid and uid != leaving
        ]

    def _claims_of(self, pod_uid: str, leaving: str | None = None) -> list[Claim]:
        return [one.claim for one in self._recorded_of(pod_uid, leaving)]

    def _another_pod(self, claim: Claim) -> bool:
        """Whether the region of the claim's pod's name is another pod's now: a claim of
        another pod of that name is prepared, or the pod source made it for another pod (one
        of the device plugin's alone, which has no claim here)."""
        made_for = self.region_made_for(claim.namespace, claim.pod)
        return (made_for is not None and made_for != claim.pod_uid) or any(
            one.claim.pod_uid != claim.pod_uid
            and (one.claim.namespace, one.claim.pod) == (claim.namespace, claim.pod)
            for one in self._checkpoint.claims.values()
        )

    def _apply(
        self,
        pod_uid: str,
        one: Prepared,
        leaving: str | None = None,
        joining: Claim | None = None,
    ) -> bool:
        """The pod's region holds the quota of its recorded claims (but ``leaving``) and
        ``joining``; whether there is one (a claim that leaves makes none)."""
        claims = self._claims_of(pod_uid, leaving) + ([joining] if joining else [])
        quota = pod_quota(claims, self.config.pool, self._gpus)
        limits = dict(quota.limits)
        if leaving is not None:
            limits |= self._released(one.claim, quota.limits)
        namespace, pod = one.claim.namespace, one.claim.pod
        try:
            self._store.update(namespace, pod, limits, by_admin=False)
        except PodNotFound:
            if leaving is not None:
                # The region was deleted before the kubelet unprepared the pod's claims
                # (through the daemon's API, say): there is no quota left to lower. Before, the
                # first of two claims' Unprepare made it again with the other's quota, or took
                # over the file a forced delete kept, marked deleted, for the pod's workers (or
                # failed for as long as they ran, where the file listed the leaving claim's GPU).
                return False
            owner = one.owner
            self._store.create(namespace, pod, quota.limits, owner=owner.user, group=owner.group)
        # Its claims' class and weight, or the defaults where none gives one: a claim that left
        # takes its own with it.
        qos = Qos.MEDIUM if quota.qos is None else quota.qos
        self._store.set_policy(namespace, pod, qos, quota.weight or 0)
        return True

    def _released(self, leaving: Claim, kept: Mapping[str, GpuLimits]) -> dict[str, GpuLimits]:
        """RELEASED for each GPU of the claim that leaves that the pod's other claims do not
        hold. Before, its entry kept the claim's limits until the pod's last claim went: the
        pod went on using a GPU it no longer held, and the daemon weighed it there. Only the
        claim's own GPUs: a pod of the device plugin too has the plugin's GPUs in its region."""
        gone = {gpu.uuid for s in leaving.shares if (gpu := self._gpus.get(s.device)) is not None}
        return {uuid: RELEASED for uuid in gone - set(kept)}

    def unprepare(self, namespace: str, name: str, uid: str) -> None:
        """What Prepare made for the claim removed; PodConflict while processes use it."""
        lowered = None  # the pod whose quota was lowered to its other claims
        with self._lock:
            known = self._checkpoint.claims.get(uid)
            if known is not None:
                claim = known.claim
                if self._another_pod(claim):
                    # The region of the pod's name is a newer pod's now (a StatefulSet's pod
                    # deleted with force and made again, its claims prepared before the old
                    # one's were unprepared): before, the old claim's last Unprepare deleted
                    # it under the new pod, or failed for as long as its workers ran.
                    log.info(
                        "claim %s/%s: pod %s was made again (UID %s): its region is the new "
                        "pod's, left as it is",
                        namespace,
                        name,
                        claim.pod,
                        claim.pod_uid,
                    )
                elif self._claims_of(claim.pod_uid, leaving=uid):
                    if self._apply(claim.pod_uid, known, leaving=uid):
                        lowered = claim.pod_uid  # (no region: nothing for the source to write)
                else:
                    with contextlib.suppress(PodNotFound):
                        self._store.delete(claim.namespace, claim.pod)
                del self._checkpoint.claims[uid]
                self._checkpoint.save()
                log.info("claim %s/%s of pod %s unprepared", namespace, name, claim.pod)
            cdi.remove_spec(self.config.cdi_dir, uid)
        if lowered is not None:
            self.claim_left(lowered)
