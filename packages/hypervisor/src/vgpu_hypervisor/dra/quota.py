"""A pod's quota from its claims: per GPU, the memory and compute its shares consumed, added up
over every claim of the pod (one region per pod, however many claims or containers), with the
burst and oversubscription of each share's parameters (a GPU's burst, where one of its shares
sets one, adds up theirs and the compute of those that set none); the pod's class and weight.

A share that consumed no memory (an allocation without consumable capacity) has the GPU's
memory, one that consumed no compute or all of it has no compute limit.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from vgpu_common.limits import HUNDREDTHS_PER_PERCENT, WHOLE_GPU, GpuLimits, Qos

from vgpu_hypervisor.dra.claims import Claim, ClaimError, Share
from vgpu_hypervisor.dra.config import GpuConfig, merge, parse_config
from vgpu_hypervisor.kubernetes.annotations import NodeGpu

DEVICE_PREFIX: Final = "gpu-"
# What a GPU no claim of the pod holds any more is given: its entry cannot leave the region
# (the limiter keeps to the GPUs a region lists, and entries are never removed), so it is held
# to the least the region can say, short of "no limit" (0): one byte of memory, so any
# allocation there is refused, and 0.01 % of the time, which the daemon's scheduler then weighs
# as next to nothing. Written as limits the daemon holds, a tenant's raise is set back.
RELEASED: Final = GpuLimits(memory=1, compute=1)


def device_name(gpu: NodeGpu) -> str:
    """The GPU's device name in the node's ResourceSlice (a DNS label)."""
    return f"{DEVICE_PREFIX}{gpu.index}"


@dataclass(frozen=True)
class Quota:
    limits: Mapping[str, GpuLimits]  # by GPU UUID
    qos: Qos | None
    weight: int | None


def gpu_of(claim: Claim, share: Share, pool: str, gpus: Mapping[str, NodeGpu]) -> NodeGpu:
    """The node's GPU a share names; ClaimError for another node's or an unknown one."""
    gpu = gpus.get(share.device)
    if share.pool != pool or gpu is None:
        raise ClaimError(
            f"claim {claim.namespace}/{claim.name}: device {share.pool}/{share.device} is not "
            f"one of this node's ({pool})"
        )
    return gpu


def share_configs(claim: Claim) -> dict[str, GpuConfig]:
    """Each request's parameters (ConfigError when they are bad)."""
    where = f"claim {claim.namespace}/{claim.name}"
    parsed = [(requests, parse_config(p, where)) for requests, p in claim.parameters]
    configs: dict[str, GpuConfig] = {}
    for share in claim.shares:
        parent = share.request.split("/", 1)[0]  # a subrequest takes its request's config
        # In the allocation's order, the class's before the claim's: the scheduler names the
        # request served in a class's configuration, so a configuration naming the request
        # is no more specific than one for every request. Before, those naming it were
        # merged last, and a class's burst won over the claim's.
        configs[share.request] = merge(
            [
                found
                for requests, found in parsed
                if not requests or parent in requests or share.request in requests
            ]
        )
    return configs


def pod_quota(claims: Sequence[Claim], pool: str, gpus: Mapping[str, NodeGpu]) -> Quota:
    """The quota of the pod that holds ``claims``; ClaimError or ConfigError, one line."""
    memory: dict[str, int | None] = {}
    compute: dict[str, int] = {}
    burst: dict[str, int] = {}  # the bursts of the shares that set one
    plain: dict[str, int] = {}  # the compute of the shares that set none
    oversubscribe: dict[str, bool] = {}
    qos: Qos | None = None
    weight: int | None = None
    for claim in claims:
        configs = share_configs(claim)
        for share in claim.shares:
            gpu = gpu_of(claim, share, pool, gpus)
            uuid = gpu.uuid
            config = configs[share.request]
            total = gpu.memory_total
            if share.memory is not None and total is not None and share.memory > total:
                raise ClaimError(
                    f"claim {claim.namespace}/{claim.name}: device {share.device}: memory "
                    f"{share.memory} is more than the GPU has, {gpu.memory_total}"
                )
            used = share.memory if share.memory is not None else gpu.memory_total
            known = memory.get(uuid, 0)
            memory[uuid] = None if used is None or known is None else known + used
            percent = 100 if share.compute is None else share.compute
            compute[uuid] = compute.get(uuid, 0) + percent * HUNDREDTHS_PER_PERCENT
            if config.burst is not None:
                if config.burst < percent * HUNDREDTHS_PER_PERCENT:
                    raise ClaimError(
                        f"claim {claim.namespace}/{claim.name}: burst "
                        f"{config.burst / HUNDREDTHS_PER_PERCENT:g} % is below the "
                        f"{percent} % of compute it consumed"
                    )
                burst[uuid] = burst.get(uuid, 0) + config.burst
            else:
                # A share without a burst may still use its own compute: the GPU's burst, when
                # another share sets one, is never below the compute the shares add up to.
                plain[uuid] = plain.get(uuid, 0) + percent * HUNDREDTHS_PER_PERCENT
            oversubscribe[uuid] = oversubscribe.get(uuid, False) or config.oversubscribe
            if config.qos is not None:
                qos = config.qos if qos is None else max(qos, config.qos)
            if config.weight is not None:
                weight = config.weight if weight is None else max(weight, config.weight)
    limits = {}
    for uuid, used in memory.items():
        limit = compute[uuid] if compute[uuid] < WHOLE_GPU else None
        soft = None
        if uuid in burst and limit is not None:
            soft = min(burst[uuid] + plain.get(uuid, 0), WHOLE_GPU)
        # A GPU whose memory is not known has no limit to oversubscribe past.
        past = oversubscribe[uuid] and used is not None
        limits[uuid] = GpuLimits(memory=used, compute=limit, burst=soft, oversubscribe=past)
    return Quota(limits, qos, weight)
