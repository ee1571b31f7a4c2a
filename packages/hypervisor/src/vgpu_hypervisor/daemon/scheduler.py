"""Weights when a GPU is oversubscribed: the effective compute limit of each pod.

While the compute limits of the pods on a GPU add up to at most 100 %, each pod's limit holds.
Past that, the GPU is divided in proportion to weight * limit, never giving a pod more than its
limit (what a capped pod leaves is shared among the others the same way):

    share_p = min(L_p, C * w_p L_p / Σ_{q uncapped} w_q L_q)

computed by water-filling from C = 100 %, with w from the pod's weight, or from its QoS class
(low/medium/high/critical = 1/2/4/8). The daemon writes share_p into the pod's region
(scheduler_state, stamped); the limiter paces at the smaller of its limit and a fresh share, so a
daemon gone leaves every pod its own limit within 5 s."""

from collections.abc import Hashable, Mapping
from typing import TypeVar

from vgpu_limiter.region import (
    COMPUTE_UNLIMITED,
    QOS_CRITICAL,
    QOS_HIGH,
    QOS_LOW,
    QOS_MEDIUM,
    QOS_WEIGHTS,
)

WHOLE: int = COMPUTE_UNLIMITED  # 100 % in hundredths
QOS_NAMES: dict[int, str] = {
    QOS_LOW: "low",
    QOS_MEDIUM: "medium",
    QOS_HIGH: "high",
    QOS_CRITICAL: "critical",
}
QOS_BY_NAME: dict[str, int] = {name: qos for qos, name in QOS_NAMES.items()}
Key = TypeVar("Key", bound=Hashable)


def weight_of(qos: int, weight: int) -> int:
    """The pod's scheduling weight: its own, else its class's (medium for an unknown class)."""
    return weight if weight > 0 else QOS_WEIGHTS.get(qos, 2)


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
