"""Weights when a GPU is oversubscribed: the effective compute limit of each pod.

While the compute limits of the pods on a GPU add up to at most 100 %, each pod's limit holds.
Past that, the GPU is divided in proportion to weight * limit, never giving a pod more than its
limit (what a capped pod leaves is shared among the others the same way):

    share_p = min(L_p, C * w_p L_p / Σ_{q uncapped} w_q L_q)

computed by water-filling from C = 100 %, with w from the pod's weight, or from its QoS class
(low/medium/high/critical = 1/2/4/8). The daemon writes share_p into the pod's region
(scheduler_state, stamped); the limiter paces at the smaller of its limit and a fresh share, so a
daemon gone leaves every pod its own limit within 5 s.

The policy is pure: the node's pass (node.py) reads the pods from the store, hands them here and
gives the result back to the store to write."""

from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

from vgpu_common.limits import WHOLE_GPU, qos_of

from vgpu_hypervisor.daemon.pods import PodKey, PodRecord

WHOLE: int = WHOLE_GPU  # 100 % in hundredths
Key = TypeVar("Key", bound=Hashable)


def weight_of(qos: int, weight: int) -> int:
    """The pod's scheduling weight: its own, else its class's (medium for an unknown class)."""
    return weight if weight > 0 else qos_of(qos).weight


def effective_limits(pods: Mapping[Key, tuple[int, int]]) -> dict[Key, int]:
    """Effective limits (hundredths) of the pods on one GPU from (limit in hundredths, weight);
    pods without a limit (0 or 100 %) are not in the sum and get 0 (no effective limit)."""
    limited = {key: (limit, w) for key, (limit, w) in pods.items() if 0 < limit < WHOLE}
    result = {key: 0 for key in pods}
    if sum(limit for limit, _ in limited.values()) <= WHOLE:
        return result | {key: limit for key, (limit, _) in limited.items()}
    capacity = float(WHOLE)
    open_pods = dict(limited)
    while open_pods:
        total = sum(limit * w for limit, w in open_pods.values())
        capped = {
            key: limit
            for key, (limit, w) in open_pods.items()
            if capacity * limit * w / total >= limit
        }
        if not capped:
            for key, (limit, w) in open_pods.items():
                result[key] = max(1, int(capacity * limit * w / total))
            break
        for key, limit in capped.items():
            result[key] = limit
            capacity -= limit
            del open_pods[key]
    return result


def node_effective_limits(
    records: Iterable[PodRecord], policies: Mapping[PodKey, tuple[int, int]]
) -> dict[PodKey, dict[int, int]]:
    """Each pod's effective compute limit (hundredths) by the index of its device entry, from
    every pod of the node; the pods on one GPU (by UUID) are weighed against each other.
    ``policies``: each pod's (class, weight) as the daemon holds them, never the record's own
    words (its tenant can write them); a pod without one (unreadable) takes no part."""
    by_gpu: dict[str, dict[tuple[PodKey, int], tuple[int, int]]] = {}
    for record in records:
        policy = policies.get(record.key)
        if record.error is not None or policy is None:
            continue
        weight = weight_of(*policy)
        for device in record.devices:
            pods = by_gpu.setdefault(device.uuid.lower(), {})
            pods[(record.key, device.index)] = (device.compute_limit, weight)
    result: dict[PodKey, dict[int, int]] = {}
    for pods in by_gpu.values():
        for (key, index), effective in effective_limits(pods).items():
            result.setdefault(key, {})[index] = effective
    return result
