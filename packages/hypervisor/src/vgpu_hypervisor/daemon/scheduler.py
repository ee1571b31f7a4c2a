"""Weights when a GPU is oversubscribed: the effective compute limit of each pod.

Only the pods that want a GPU now (demand.py: they launched, or waited for their share, since
the previous pass) are weighed; the others keep their own limits and take nothing. A pod that
wants it but needs less than its share (its use and HEADROOM, need_of) keeps its own limit and
takes only what it uses. While the
compute limits of the pods that want a GPU add up to at most C, each pod's limit holds. Past
that, the GPU is divided in proportion to weight * limit, never giving a pod more than its limit
(what a capped pod leaves is shared among the others the same way):

    share_p = min(L_p, C * w_p L_p / Σ_{q uncapped} w_q L_q)

computed by water-filling from C, with w from the pod's weight, or from its QoS class
(low/medium/high/critical = 1/2/4/8). C is what a GPU shared by several pods can give: 100 %
less what their hand-overs leave idle (SHARED_CAPACITY), or 100 % for one pod alone. Divided
from 100 %, the hand-overs' loss fell on one pod, the largest (the one whose bucket is never in
debt, as it waits for the lease, not for its limit): on an H100, 20/30/50 got 20.4 / 29.7 / 47.8
and 30/70 beside an idle pod 30.5 / 67.6 with the GPU 98 % busy; from 98 % every pod was within
2 points (docs/scheduling.md). While limits that add up to 98-100 % are scaled, a pod that uses
less than its own leaves the others held up to 2 % below theirs. The daemon writes share_p into
the pod's region (scheduler_state, stamped); the limiter paces at the smaller of its limit and a
fresh share, so a daemon gone leaves every pod its own limit within 5 s.

The policy is pure: the node's pass (node.py) reads the pods from the store, hands them here and
gives the result back to the store to write."""

from collections.abc import Collection, Hashable, Iterable, Mapping
from typing import TypeVar

from vgpu_common.limits import WHOLE_GPU, qos_of

from vgpu_hypervisor.daemon.demand import Demand
from vgpu_hypervisor.daemon.pods import PodKey, PodRecord

WHOLE: int = WHOLE_GPU  # 100 % in hundredths
SHARED_CAPACITY = 9800
"""What a GPU that several paced pods fill can give them (hundredths): an H100 was busy 97.9-98.8 %
of the time under 30/70, 20/30/50 and 10/20/30/40 (each hand-over leaves it idle 250-370 µs)."""
# A pod under its limit may grow this much (hundredths) before a pass sees it: what a bursting
# pod beside it leaves it on top of what it used.
HEADROOM = 500
Key = TypeVar("Key", bound=Hashable)


def weight_of(qos: int, weight: int) -> int:
    """The pod's scheduling weight: its own, else its class's (medium for an unknown class)."""
    return weight if weight > 0 else qos_of(qos).weight


def capacity_of(limits: Iterable[int]) -> int:
    """What a GPU gives the pods that want it, from their limits (hundredths): SHARED_CAPACITY
    when two or more of them are limited (they take turns), the whole GPU for one alone."""
    return SHARED_CAPACITY if sum(1 for limit in limits if 0 < limit < WHOLE) > 1 else WHOLE


def need_of(ceiling: int, used: int | None) -> int:
    """What a pod under ``ceiling`` (hundredths) needs: what it used (None: not measured yet)
    and HEADROOM, never more than the ceiling; the whole ceiling while not measured. A pod its
    limit holds back uses about all of it, so it needs all of it: the headroom tells a light
    pod from a held one."""
    return ceiling if used is None else min(ceiling, used + HEADROOM)


def effective_limits(
    pods: Mapping[Key, tuple[int, int]], usage: Mapping[Key, int] | None = None
) -> dict[Key, int]:
    """Effective limits (hundredths) of the pods on one GPU from (limit in hundredths, weight);
    pods without a limit (0 or 100 %) are not in the sum and get 0 (no effective limit).
    ``usage``: what each pod used lately (hundredths; absent: not measured, counted at its
    limit). A pod that needs less than its share (need_of) keeps its own limit and takes from
    the others only what it uses: before, a pod at 50 % that used 5 cut a busy 30/70 pair to
    20/47 with the GPU 30 % idle."""
    usage = usage or {}
    limited = {key: (limit, w) for key, (limit, w) in pods.items() if 0 < limit < WHOLE}
    result = {key: 0 for key in pods}
    capacity = float(capacity_of(limit for limit, _ in pods.values()))
    need = {key: need_of(limit, usage.get(key)) for key, (limit, _) in limited.items()}
    if sum(need.values()) <= capacity:
        return result | {key: limit for key, (limit, _) in limited.items()}
    open_pods = dict(limited)
    while open_pods:
        total = sum(limit * w for limit, w in open_pods.values())
        capped = [
            key
            for key, (limit, w) in open_pods.items()
            if capacity * limit * w / total >= need[key]
        ]
        if not capped:
            for key, (limit, w) in open_pods.items():
                result[key] = max(1, int(capacity * limit * w / total))
            break
        for key in capped:
            limit = limited[key][0]
            used = usage.get(key)
            result[key] = limit
            capacity -= limit if used is None else min(limit, used)
            del open_pods[key]
    return result


def node_effective_limits(
    records: Iterable[PodRecord],
    policies: Mapping[PodKey, tuple[int, int]],
    wanting: Collection[tuple[PodKey, int]],
    usage: Mapping[tuple[PodKey, int], int] | None = None,
) -> dict[PodKey, dict[int, int]]:
    """Each pod's effective compute limit (hundredths) by the index of its device entry, from
    every pod of the node; the pods that want one GPU (by UUID) are weighed against each other.
    ``policies``: each pod's (class, weight) as the daemon holds them, never the record's own
    words (its tenant can write them); a pod without one (unreadable) takes no part.
    ``wanting``: the (pod, device entry) pairs that want their GPU now; the others get 0 (no
    effective limit: their own holds) and take nothing from the pods that do. ``usage``: what
    each (pod, device entry) used lately (hundredths), where measured."""
    by_gpu: dict[str, dict[tuple[PodKey, int], tuple[int, int]]] = {}
    result: dict[PodKey, dict[int, int]] = {}
    for record in records:
        policy = policies.get(record.key)
        if record.error is not None or policy is None:
            continue
        weight = weight_of(*policy)
        for device in record.devices:
            if (record.key, device.index) not in wanting:
                result.setdefault(record.key, {})[device.index] = 0
                continue
            pods = by_gpu.setdefault(device.uuid.lower(), {})
            pods[(record.key, device.index)] = (device.compute_limit, weight)
    for pods in by_gpu.values():
        for (key, index), effective in effective_limits(pods, usage).items():
            result.setdefault(key, {})[index] = effective
    return result


def burst_rates(pods: Mapping[Key, tuple[int, int, int | None]]) -> dict[Key, int]:
    """The rates (hundredths) the pods with a soft limit may run at while others want the GPU,
    from each wanting pod's (hard limit, soft limit, use or None): their hard limit and what the
    others leave. Every pod is counted at what it needs (need_of): what it used and some
    headroom, never more than its ceiling (its soft limit for a bursting pod, else its limit),
    all of it when not yet measured or held back (it would use more). A bursting pod's need up
    to its hard limit is its own; what is left goes first to the bursting pods that need more
    than their hard limit, in proportion to their room above it, and what they do not need then
    to every bursting pod the same way, never past its soft limit. None left, or no other pod
    wants the GPU: 0 (their hard limit holds while contended). A pod that needs more than it got
    last pass gains the headroom each pass. Before, a bursting pod was counted at its whole
    hard limit whatever it used: a training pod (50, burst 100) beside an inference pod (50,
    burst 100) that used a fifth of the GPU was held to 50 with the GPU a third idle.
    While a pod without a soft limit is counted at its whole limit (it uses all of it, or is not
    measured yet), what is left is counted from what the GPU gives the pods (capacity_of), as
    their effective limits are: from 100 % the 2 % kept back for hand-overs went to the bursting
    pod, 51 beside another's 49. Beside pods under their limits it is counted from 100 %: their
    headroom leaves room enough, and a smaller rate would leave the GPU idle."""
    bursting = {key: (hard, soft) for key, (hard, soft, _) in pods.items() if soft > hard}
    if len(pods) == 1:
        # Alone: nothing the others leave was measured. The limiter bursts while it sees no
        # other pod, and falls to its hard limit at the first that waits until a pass weighs
        # it in. Published as its soft limit, the rate held a pod at 30 (burst 100) at 100
        # beside a 70 % pod that woke, which then got 43-58 % for five seconds.
        return dict.fromkeys(bursting, 0)
    needed = 0
    held = False  # a pod without a soft limit counted at its whole limit
    beyond: dict[Key, int] = {}  # what each bursting pod needs above its hard limit
    for key, (hard, soft, used) in pods.items():
        if key in bursting:
            need = need_of(min(soft, WHOLE), used)
            needed += min(need, hard)
            beyond[key] = max(0, need - hard)
            continue
        ceiling = hard if 0 < hard < WHOLE else WHOLE
        need = need_of(ceiling, used)
        needed += need
        held = held or need >= ceiling
    capacity = capacity_of(hard for hard, _, _ in pods.values()) if held else WHOLE
    room = {key: min(soft, WHOLE) - hard for key, (hard, soft) in bursting.items()}
    extra = _share_by_room(capacity - needed, room, beyond)
    left = capacity - needed - sum(extra.values())
    more = _share_by_room(left, room, {key: room[key] - extra[key] for key in bursting})
    return {
        key: bursting[key][0] + extra[key] + more[key] if extra[key] + more[key] > 0 else 0
        for key in bursting
    }


def _share_by_room(left: int, room: Mapping[Key, int], caps: Mapping[Key, int]) -> dict[Key, int]:
    """``left`` (hundredths) given out in proportion to each pod's ``room``, none past its cap;
    what a capped pod does not take goes to the others the same way."""
    given = dict.fromkeys(caps, 0)
    open_pods = {key: cap for key, cap in caps.items() if cap > 0 and room[key] > 0}
    while left > 0 and open_pods:
        total = sum(room[key] for key in open_pods)
        step = {key: min(rest, left * room[key] // total) for key, rest in open_pods.items()}
        for key, amount in step.items():
            given[key] += amount
            open_pods[key] -= amount
        left -= sum(step.values())
        full = [key for key, rest in open_pods.items() if rest <= 0]
        for key in full:
            del open_pods[key]
        if not full:
            break
    return given


def node_burst_rates(
    records: Iterable[PodRecord],
    effective: Mapping[PodKey, Mapping[int, int]],
    demand: Demand,
) -> dict[PodKey, dict[int, int]]:
    """Each bursting pod's burst rate by device entry (0: none), from the pods that want each GPU
    (their effective limits as the hard ones where set)."""
    by_gpu: dict[str, dict[tuple[PodKey, int], tuple[int, int, int | None]]] = {}
    result: dict[PodKey, dict[int, int]] = {}
    usage = demand.unhindered_usage
    for record in records:
        if record.error is not None:
            continue
        for device in record.devices:
            key = (record.key, device.index)
            if key not in demand.wanting:
                if device.compute_soft_limit > device.compute_limit:
                    # None: an earlier pass's rate, written for others it no longer counts,
                    # stayed fresh for 5 s and was run at when the pod woke.
                    result.setdefault(record.key, {})[device.index] = 0
                continue
            hard = effective.get(record.key, {}).get(device.index, 0) or device.compute_limit
            by_gpu.setdefault(device.uuid.lower(), {})[key] = (
                hard,
                device.compute_soft_limit,
                usage.get(key),
            )
    for pods in by_gpu.values():
        for (pod, index), rate in burst_rates(pods).items():
            result.setdefault(pod, {})[index] = rate
    return result
