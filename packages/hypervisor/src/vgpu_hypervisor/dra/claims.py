"""A ResourceClaim (resource.k8s.io/v1) as the driver reads it: what the scheduler allocated
to this driver (devices and the capacity each share consumes), the pod it is reserved for, and
the opaque parameters given to this driver. Plain data from the object's JSON; a claim that
cannot be prepared is a ClaimError of one line, which the kubelet shows on the pod.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vgpu_common.limits import parse_quantity

DRIVER: Final = "gpu.vgpu.io"
MEMORY: Final = "memory"  # capacity names, as the ResourceSlice declares them
COMPUTE: Final = "compute"
_MOST_BYTES: Final = (1 << 64) - 1
# The least of each capacity a share consumes (the slice's validRange.min): the scheduler
# rounds a request up to it, so less is a status written by hand.
LEAST: Final = {MEMORY: 1 << 20, COMPUTE: 1}


class ClaimError(Exception):
    """The claim cannot be prepared as allocated; one line."""


@dataclass(frozen=True)
class Share:
    """One allocated device: the GPU ``device`` of ``pool`` for the claim's ``request``, with
    the capacity it consumes (None: the allocation consumed none of it, so all of it)."""

    request: str
    pool: str
    device: str
    memory: int | None  # bytes
    compute: int | None  # percent of the GPU's time
    share_id: str | None = None


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    pod: str  # the pod it is reserved for: name and UID
    pod_uid: str
    shares: tuple[Share, ...]
    # The opaque parameters given to this driver, from the class first, then the claim's own
    # (a later one wins), each with the requests it applies to (empty: all).
    parameters: tuple[tuple[tuple[str, ...], Mapping[str, Any]], ...] = ()


def parse_claim(obj: Mapping[str, Any], uid: str) -> Claim:
    """The claim of the object ``obj`` (the API server's JSON); ClaimError when it is not the
    claim the kubelet named (``uid``), is not allocated, or is not reserved for one pod."""
    meta = _mapping(obj.get("metadata"))
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    where = f"claim {namespace}/{name}"
    if meta.get("uid") != uid:
        raise ClaimError(f"{where}: its UID is {meta.get('uid')}, not {uid} (made anew?)")
    status = _mapping(obj.get("status"))
    devices = _devices(obj)
    results = _results(devices)
    if not results:
        raise ClaimError(f"{where}: not allocated any {DRIVER} device")
    pods = [
        _mapping(c)
        for c in _list(status.get("reservedFor"))
        if _mapping(c).get("resource") == "pods" and not _mapping(c).get("apiGroup")
    ]
    if len(pods) != 1:
        raise ClaimError(
            f"{where}: reserved for {len(pods)} pods; a {DRIVER} claim gives one pod its "
            "quota (use a ResourceClaimTemplate for one claim per pod)"
        )
    shares = tuple(_share(where, _mapping(r)) for r in results)
    parameters = tuple(
        (tuple(str(r) for r in _list(c.get("requests"))), _mapping(opaque.get("parameters")))
        for c in map(_mapping, _list(devices.get("config")))
        if (opaque := _mapping(c.get("opaque"))).get("driver") == DRIVER
    )
    return Claim(
        namespace,
        name,
        uid,
        str(pods[0].get("name", "")),
        str(pods[0].get("uid", "")),
        shares,
        parameters,
    )


def of_driver(obj: Mapping[str, Any]) -> bool:
    """Whether the claim object ``obj`` was allocated a device of this driver (a NIC's, say,
    is another driver's). A claim not allocated yet cannot say: ClaimError."""
    if not _mapping(_mapping(obj.get("status")).get("allocation")):
        meta = _mapping(obj.get("metadata"))
        where = f"claim {meta.get('namespace')}/{meta.get('name')}"
        raise ClaimError(f"{where}: not allocated yet")
    return bool(_results(_devices(obj)))


def _devices(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """status.allocation.devices of the claim object ``obj`` (empty: not allocated)."""
    return _mapping(_mapping(_mapping(obj.get("status")).get("allocation")).get("devices"))


def _results(devices: Mapping[str, Any]) -> list[Any]:
    """The allocation's results of this driver."""
    return [r for r in _list(devices.get("results")) if _mapping(r).get("driver") == DRIVER]


def _share(where: str, result: Mapping[str, Any]) -> Share:
    consumed = _mapping(result.get("consumedCapacity"))
    device = str(result.get("device", ""))
    values: dict[str, int | None] = {}
    for capacity, most in ((MEMORY, _MOST_BYTES), (COMPUTE, 100)):
        text = consumed.get(capacity)
        try:
            values[capacity] = None if text is None else parse_quantity(str(text), most)
        except ValueError as error:
            raise ClaimError(f"{where}: device {device}: {capacity} {text!r}: {error}") from None
        value = values[capacity]
        if value is not None and value < LEAST[capacity]:
            # Before, a compute of 0 was taken as the whole GPU, and a memory of 0 failed
            # later as "ValueError: bad memory limit 0".
            raise ClaimError(
                f"{where}: device {device}: {capacity} {text!r} is below the least a share "
                f"consumes, {LEAST[capacity]}"
            )
    share_id = result.get("shareID")
    return Share(
        str(result.get("request", "")),
        str(result.get("pool", "")),
        device,
        values[MEMORY],
        values[COMPUTE],
        None if share_id is None else str(share_id),
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else []
