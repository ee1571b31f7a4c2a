"""The stand-in for kube-scheduler's DRA allocation (and for kube-controller-manager's
resource-claim controller), for tests: what a cluster does between ``kubectl apply`` of a pod
and the kubelet's NodePrepareResources.

For a pending pod, :meth:`Scheduler.schedule`

1. makes the pod's ResourceClaims from its ResourceClaimTemplates (named
   ``{pod}-{claim}-{5 characters}``, owned by the pod, annotated with the pod's claim name) and
   records them in the pod's ``status.resourceClaimStatuses``, as the claim controller does;
2. picks devices for every claim on one node from that node's ResourceSlices, following the
   scheduler's rules for consumable capacity (resource.k8s.io/v1, DRAConsumableCapacity):

   - a device matches a request when it matches the CEL selectors of the request's DeviceClass
     and of the request (the subset below), has every capacity the request names, and the
     request's amounts fit the device's request policy (a device that is not shared: they are
     at most its capacities);
   - the amount consumed of each capacity is the amount asked, or the policy's default when the
     request names none, or the whole capacity when there is neither; rounded up to the
     smallest of ``validValues`` at least that, or, in ``validRange``, up to ``min`` and then to
     ``min + n * step``; an amount above every valid value or above ``max`` does not fit;
   - a device with ``allowMultipleAllocations`` is shared: the amounts consumed of each of its
     capacities by all allocated claims (this one's shares included) never exceed the
     capacity's value, and each share gets a ``shareID``; any other device is given once;
   - a device with a taint (DRADeviceTaints) of effect ``NoSchedule`` or ``NoExecute`` is
     passed over unless the request tolerates it: a toleration with the taint's key (operator
     ``Equal`` and its value, or ``Exists``) or with no key and ``Exists``, and with the
     taint's effect or none;
   - ``exactly`` requests only (``firstAvailable`` is not followed), allocation mode
     ``ExactCount`` (count devices, each device once per request) or ``All``; constraints
     ``matchAttribute`` and ``distinctAttribute``; devices are tried in slice order, first fit,
     with backtracking over the claim's requests;
   a pod whose containers ask for an extended resource that a DeviceClass maps (its
   ``extendedResourceName``, or ``deviceclass.resource.kubernetes.io/{class}`` for any class;
   DRAExtendedResource, KEP-5004) gets one more claim, made as the scheduler makes it: one
   ``exactly`` request per container and resource, named ``container-{i}-request-{j}`` (``i``
   the container's index, ``j`` the resource's among the container's sorted request names),
   ``ExactCount`` of the quantity asked and no capacity, so each device consumes its request
   policy's defaults; a node whose ``status.allocatable`` lists the resource serves it by its
   device plugin, which this stand-in does not follow (the pod is not placed there);
3. writes each claim's ``status.allocation`` (``devices.results`` with ``consumedCapacity`` for
   shared devices and ``shareID``, ``devices.config`` with the class's opaque configuration
   before the claim's, ``nodeSelector`` naming the node) and ``status.reservedFor`` the pod,
   through the status subresource; the extended resources' claim is created then, allocated
   (``generateName`` ``{pod}-extended-resources-``, owned by the pod, annotated
   ``resource.kubernetes.io/extended-resource-claim: "true"``) and named in the pod's
   ``status.extendedResourceClaimStatus`` with the container-to-request mappings; then binds
   the pod to the node.

A pod whose claims fit no node stays pending with the condition ``PodScheduled`` false,
reason ``Unschedulable`` and a message saying why, as the scheduler reports it.

After pods end, :meth:`Scheduler.release_claims` does what the resource-claim controller and
the garbage collector do with their claims (the node's kubelet has unprepared them before the
pod's last delete):

1. a claim's ``status.reservedFor`` loses each pod that is gone (no pod of that name and UID),
   has ended (phase ``Succeeded`` or ``Failed``) or is being deleted without having been bound
   to a node;
2. a claim reserved for no one any more is deallocated: its ``status.allocation`` is removed,
   so what its devices' capacity held is free for the next claim;
3. a claim owned by a pod (``ownerReferences``, as those made from templates and for extended
   resources are) is deleted once that pod is gone or has ended; a claim the user made stays,
   deallocated.

CEL selectors: expressions joined by ``&&`` of ``device.driver == "…"``,
``device.attributes["domain"].name == <string, int or bool>``,
``device.attributes["domain"].name.matches("regex")`` and
``device.capacity["domain"].name.compareTo(quantity("…")) >= 0``. Any other expression is
refused (:class:`Unsupported`), never guessed.
"""

from __future__ import annotations

import copy
import random
import re
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu_common.limits import parse_quantity

from tests.support.apiserver import ApiServer
from tests.support.apiserver.kinds import BUILTIN, POD, Kind
from tests.support.apiserver.selectors import Selector

Object = dict[str, Any]
DeviceKey = tuple[str, str, str]  # driver, pool, device
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"  # every class's implicit resource name
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what generated names end with


def _kind(plural: str) -> Kind:
    (kind,) = [k for k in BUILTIN if (k.group, k.plural) == ("resource.k8s.io", plural)]
    return kind


CLASSES, CLAIMS, TEMPLATES, SLICES = map(
    _kind, ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices")
)
(NODES,) = [k for k in BUILTIN if (k.group, k.plural) == ("", "nodes")]


def quantity(text: str) -> int:
    """A whole-number quantity ("80Gi", "30", "1e3")."""
    return parse_quantity(text, 1 << 80)


class Unsupported(ValueError):
    """A claim or selector this stand-in does not follow."""


class Unschedulable(Exception):
    """No node can take the pod's claims; one line, as the pod's condition says it."""


# CEL, the subset

_STRING = r'"((?:[^"\\]|\\.)*)"'
_ATTRIBUTE = rf"device\.attributes\[{_STRING}\]\.(\w+)"
_TERMS = [
    ("driver", re.compile(rf"device\.driver\s*==\s*{_STRING}")),
    ("equals", re.compile(rf"{_ATTRIBUTE}\s*==\s*({_STRING}|-?\d+|true|false)")),
    ("matches", re.compile(rf"{_ATTRIBUTE}\.matches\({_STRING}\)")),
    (
        "capacity",
        re.compile(
            rf"device\.capacity\[{_STRING}\]\.(\w+)\.compareTo\(quantity\({_STRING}\)\)\s*>=\s*0"
        ),
    ),
]


def _value(attribute: Mapping[str, Any]) -> Any:
    (value,) = attribute.values()
    return value


def cel_matches(expression: str, driver: str, device: Mapping[str, Any]) -> bool:
    """Whether ``device`` (of a slice of ``driver``) satisfies ``expression``."""
    result = True
    for term in (t.strip() for t in expression.split("&&")):
        found = [(name, m) for name, p in _TERMS if (m := p.fullmatch(term)) is not None]
        if not found:
            raise Unsupported(f"CEL expression {term!r} is not in the stand-in's subset")
        ((name, match),) = found
        groups = match.groups()
        if name == "driver":
            result &= driver == groups[0]
            continue
        domain, key = groups[0], groups[1]
        if domain != driver:
            return False  # this driver's devices have no attribute of another domain
        if name == "capacity":
            capacity = device.get("capacity", {}).get(key)
            result &= capacity is not None and quantity(str(capacity["value"])) >= quantity(
                groups[2]
            )
            continue
        attribute = device.get("attributes", {}).get(key)
        if attribute is None:
            return False  # a missing attribute is an error in CEL: the device does not match
        value = _value(attribute)
        if name == "matches":
            result &= isinstance(value, str) and re.search(groups[2], value) is not None
        else:
            literal = groups[2]
            wanted: Any = (
                groups[3]
                if literal.startswith('"')
                else literal == "true"
                if literal in ("true", "false")
                else int(literal)
            )
            result &= value == wanted
    return result


# Consumable capacity


def consumed_amount(capacity: Mapping[str, Any], asked: str | None) -> int | None:
    """What a request consumes of a device's ``capacity`` ({value, requestPolicy}): the amount
    ``asked`` (None: not named) rounded up by the policy; None when the policy does not allow
    it."""
    value = quantity(str(capacity["value"]))
    policy = capacity.get("requestPolicy") or {}
    if asked is None:
        default = policy.get("default")
        return value if default is None else quantity(str(default))
    amount = quantity(str(asked))
    if "validValues" in policy:
        valid = sorted(quantity(str(v)) for v in policy["validValues"])
        return next((v for v in valid if v >= amount), None)
    span = policy.get("validRange")
    if span is not None:
        low = quantity(str(span.get("min", "0")))
        amount = max(amount, low)
        if span.get("step") is not None:
            step = quantity(str(span["step"]))
            amount = low + -(-(amount - low) // step) * step
        if span.get("max") is not None and amount > quantity(str(span["max"])):
            return None
    return amount


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    node: str
    spec: Mapping[str, Any]

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.spec["name"])

    @property
    def shared(self) -> bool:
        return bool(self.spec.get("allowMultipleAllocations"))

    def capacities(self) -> dict[str, int]:
        return {
            name: quantity(str(c["value"])) for name, c in self.spec.get("capacity", {}).items()
        }

    def consumption(self, asked: Mapping[str, str]) -> dict[str, int] | None:
        """The capacity a request asking ``asked`` consumes of this device; None: it does not
        fit the device (a capacity it lacks, or one its policy refuses)."""
        capacity = self.spec.get("capacity", {})
        if set(asked) - set(capacity):
            return None
        if not self.shared:  # the whole device: it has at least what is asked
            limits = self.capacities()
            fits = all(quantity(str(v)) <= limits[k] for k, v in asked.items())
            return {} if fits else None
        amounts: dict[str, int] = {}
        for name, one in capacity.items():
            amount = consumed_amount(one, asked.get(name))
            if amount is None:
                return None
            amounts[name] = amount
        return amounts


@dataclass
class Usage:
    """What the allocated claims hold: amounts consumed of shared devices, devices given."""

    consumed: dict[DeviceKey, dict[str, int]]
    taken: set[DeviceKey]

    @classmethod
    def of(cls, claims: Sequence[Mapping[str, Any]]) -> Usage:
        usage = cls(defaultdict(lambda: defaultdict(int)), set())
        for claim in claims:
            results = (
                claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
            )
            for result in results:
                usage.add(
                    (result["driver"], result["pool"], result["device"]),
                    {k: quantity(str(v)) for k, v in result.get("consumedCapacity", {}).items()},
                    shared="shareID" in result or "consumedCapacity" in result,
                )
        return usage

    def add(self, key: DeviceKey, amounts: Mapping[str, int], *, shared: bool) -> None:
        if not shared:
            self.taken.add(key)
        for name, amount in amounts.items():
            self.consumed[key][name] += amount

    def remove(self, key: DeviceKey, amounts: Mapping[str, int], *, shared: bool) -> None:
        if not shared:
            self.taken.discard(key)
        for name, amount in amounts.items():
            self.consumed[key][name] -= amount

    def fits(self, device: Device, amounts: Mapping[str, int]) -> bool:
        if device.key in self.taken:
            return False
        if not device.shared:
            return not any(self.consumed.get(device.key, {}).values())
        held = self.consumed.get(device.key, {})
        limits = device.capacities()
        return all(held.get(name, 0) + amount <= limits[name] for name, amount in amounts.items())


@dataclass(frozen=True)
class Pick:
    request: str
    device: Device
    amounts: Mapping[str, int]


def _attribute(device: Device, qualified: str) -> Any:
    domain, _, name = qualified.rpartition("/")
    if domain != device.driver:
        return None
    attribute = device.spec.get("attributes", {}).get(name)
    return None if attribute is None else _value(attribute)


def _constraints_hold(claim: Mapping[str, Any], picks: Sequence[Pick]) -> bool:
    for constraint in claim["spec"]["devices"].get("constraints", []):
        names = constraint.get("requests")
        chosen = [p.device for p in picks if not names or p.request in names]
        if "matchAttribute" in constraint:
            values = [_attribute(d, constraint["matchAttribute"]) for d in chosen]
            if None in values or len(set(values)) > 1:
                return False
        if "distinctAttribute" in constraint:
            values = [_attribute(d, constraint["distinctAttribute"]) for d in chosen]
            if None in values or len(set(values)) != len(values):
                return False
    return True


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for toleration in tolerations:
        operator = toleration.get("operator", "Equal")
        key = toleration.get("key", "")
        if key and key != taint["key"]:
            continue
        if not key and operator != "Exists":
            continue
        if operator == "Equal" and toleration.get("value", "") != taint.get("value", ""):
            continue
        if toleration.get("effect") in (None, "", taint["effect"]):
            return True
    return False


def _untainted(device: Device, tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the device may be allocated: each of its taints is tolerated."""
    return all(
        taint.get("effect") not in ("NoSchedule", "NoExecute") or _tolerates(tolerations, taint)
        for taint in device.spec.get("taints") or []
    )


def _matching(
    request: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], devices: Sequence[Device]
) -> Iterator[tuple[Device, dict[str, int]]]:
    exact = request["exactly"]
    device_class = classes.get(exact["deviceClassName"])
    if device_class is None:
        raise Unschedulable(f'device class "{exact["deviceClassName"]}" not found')
    selectors = [
        s["cel"]["expression"]
        for s in [*device_class.get("spec", {}).get("selectors", []), *exact.get("selectors", [])]
    ]
    asked = exact.get("capacity", {}).get("requests", {})
    tolerations = exact.get("tolerations", [])
    for device in devices:
        if not _untainted(device, tolerations):
            continue
        if all(cel_matches(e, device.driver, device.spec) for e in selectors):
            amounts = device.consumption(asked)
            if amounts is not None:
                yield device, amounts


def allocate(
    claim: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    devices: Sequence[Device],
    usage: Usage,
) -> list[Pick] | None:
    """Devices for every request of ``claim`` among ``devices`` (one node's), given what
    ``usage`` holds already; None when they do not fit. ``usage`` is left as it was."""
    slots: list[tuple[str, list[tuple[Device, dict[str, int]]]]] = []
    for request in claim["spec"]["devices"]["requests"]:
        if "exactly" not in request:
            raise Unsupported(f"request {request['name']}: only 'exactly' requests are followed")
        candidates = list(_matching(request, classes, devices))
        mode = request["exactly"].get("allocationMode", "ExactCount")
        if mode == "All":
            if not candidates:
                return None
            count = len(candidates)
        else:
            count = int(request["exactly"].get("count", 1))
        slots += [(request["name"], candidates)] * count

    picks: list[Pick] = []

    def place(at: int) -> bool:
        if at == len(slots):
            return _constraints_hold(claim, picks)
        request, candidates = slots[at]
        for device, amounts in candidates:
            if any(p.request == request and p.device.key == device.key for p in picks):
                continue  # each device once per request
            if not usage.fits(device, amounts):
                continue
            usage.add(device.key, amounts, shared=device.shared)
            picks.append(Pick(request, device, amounts))
            if _constraints_hold(claim, picks) and place(at + 1):
                usage.remove(device.key, amounts, shared=device.shared)  # the caller commits
                return True
            picks.pop()
            usage.remove(device.key, amounts, shared=device.shared)
        return False

    return list(picks) if place(0) else None


def allocation(
    claim: Mapping[str, Any],
    picks: Sequence[Pick],
    classes: Mapping[str, Mapping[str, Any]],
    node: str,
) -> Object:
    """The claim's ``status.allocation`` for ``picks`` on ``node``."""
    results = []
    for pick in picks:
        result: Object = {
            "request": pick.request,
            "driver": pick.device.driver,
            "pool": pick.device.pool,
            "device": pick.device.spec["name"],
        }
        if pick.device.shared:
            result["shareID"] = str(uuid.uuid4())
            result["consumedCapacity"] = {k: str(v) for k, v in pick.amounts.items()}
        results.append(result)
    config: list[Object] = []
    requests = claim["spec"]["devices"]["requests"]
    for request in requests:
        device_class = classes[request["exactly"]["deviceClassName"]]
        for one in device_class.get("spec", {}).get("config", []):
            config.append({"source": "FromClass", "requests": [request["name"]], **one})
    for one in claim["spec"]["devices"].get("config", []):
        config.append({"source": "FromClaim", **one})
    devices: Object = {"results": results}
    if config:
        devices["config"] = config
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"devices": devices, "nodeSelector": {"nodeSelectorTerms": [term]}}


# Extended resources backed by DRA (KEP-5004)


def extended_resource_classes(classes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name to the DeviceClass that serves it: a class's
    ``extendedResourceName`` (several classes naming one: the one created last, then the
    first by name) and every class's implicit name."""
    mapping = {IMPLICIT_PREFIX + c["metadata"]["name"]: c["metadata"]["name"] for c in classes}
    by_name = sorted(classes, key=lambda c: str(c["metadata"]["name"]))
    newest_first = sorted(by_name, key=lambda c: str(c["metadata"]["creationTimestamp"]),
                          reverse=True)  # fmt: skip
    for device_class in newest_first:
        name = device_class.get("spec", {}).get("extendedResourceName")
        if name is not None:
            mapping.setdefault(name, device_class["metadata"]["name"])
    return mapping


def extended_requests(
    pod: Mapping[str, Any], mapping: Mapping[str, str]
) -> tuple[list[Object], list[Object]]:
    """The requests of the claim the scheduler makes for ``pod``'s extended resources that
    ``mapping`` maps to a class, and the pod's ``requestMappings`` (container, resource,
    request); both empty when the pod asks for none."""
    spec = pod["spec"]
    requests: list[Object] = []
    mappings: list[Object] = []
    inits = len(spec.get("initContainers", []))
    for index, container in enumerate([*spec.get("initContainers", []), *spec["containers"]]):
        resources = container.get("resources", {})
        asked = {**resources.get("limits", {}), **resources.get("requests", {})}
        for at, resource in enumerate(sorted(asked)):
            count = quantity(str(asked[resource]))
            if resource not in mapping or count == 0:
                continue
            if index < inits:  # the scheduler lets later containers reuse their devices
                raise Unsupported("extended resources of init containers are not followed")
            name = f"container-{index}-request-{at}"
            requests.append({"name": name, "exactly": {
                "deviceClassName": mapping[resource], "allocationMode": "ExactCount",
                "count": count}})  # fmt: skip
            mappings.append(
                {"containerName": container["name"], "resourceName": resource, "requestName": name}
            )
    requests.sort(key=lambda r: str(r["name"]))
    return requests, mappings


# The cluster side


class Scheduler:
    """Schedules pending pods with ResourceClaims against the API server ``api``."""

    def __init__(self, api: ApiServer, seed: int = 0) -> None:
        self.api = api
        self._random = random.Random(seed)

    def _all(self, kind: Kind, namespace: str | None = None) -> list[Object]:
        items, _ = self.api.store.select(kind, namespace, Selector((), ()))
        return sorted(items, key=lambda o: o["metadata"]["name"])

    def claims_of(self, pod: Mapping[str, Any]) -> list[Object]:
        """The pod's claims, made from its templates where they are not made yet."""
        store, meta = self.api.store, pod["metadata"]
        namespace = meta["namespace"]
        made = {s["name"]: s["resourceClaimName"]
                for s in pod.get("status", {}).get("resourceClaimStatuses", [])}  # fmt: skip
        claims = []
        for entry in pod["spec"].get("resourceClaims", []):
            name = entry.get("resourceClaimName") or made.get(entry["name"])
            if name is None:
                template = store.get(TEMPLATES, namespace, entry["resourceClaimTemplateName"])
                suffix = "".join(
                    self._random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in "12345"
                )
                body: Object = {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {
                        **copy.deepcopy(template["spec"].get("metadata", {})),
                        "name": f"{meta['name']}-{entry['name']}-{suffix}",
                        "annotations": {POD_CLAIM_NAME: entry["name"]},
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Pod",
                                "name": meta["name"],
                                "uid": meta["uid"],
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": copy.deepcopy(template["spec"]["spec"]),
                }
                name = store.create(CLAIMS, namespace, body, strict=True, dry_run=False)[0][
                    "metadata"
                ]["name"]
                made[entry["name"]] = name
                statuses = [{"name": k, "resourceClaimName": v} for k, v in made.items()]
                pod = self._status(POD, namespace, meta["name"], resourceClaimStatuses=statuses)
            claims.append(store.get(CLAIMS, namespace, name))
        return claims

    def _status(self, kind: Kind, namespace: str, name: str, **fields: Any) -> Object:
        def change(current: Object) -> Object:
            current.setdefault("status", {}).update(fields)
            return current

        updated, _ = self.api.store.update(
            kind, namespace, name, change, subresource="status", strict=True, dry_run=False
        )
        return updated

    def devices(self) -> dict[str, list[Device]]:
        """Each node's devices, from the ResourceSlices, in slice order."""
        by_node: dict[str, list[Device]] = defaultdict(list)
        for one in self._all(SLICES):
            spec = one["spec"]
            node = spec.get("nodeName")
            if node is None:
                continue  # devices of several nodes: not followed
            for device in spec.get("devices", []):
                by_node[node].append(Device(spec["driver"], spec["pool"]["name"], node, device))
        return by_node

    def schedule(self, namespace: str, name: str) -> str:
        """The pod allocated its claims on a node and bound to it: the node's name.
        Unschedulable (reported on the pod) when no node can take them."""
        pod = self.api.store.get(POD, namespace, name)
        if pod["spec"].get("nodeName"):
            return str(pod["spec"]["nodeName"])
        claims = self.claims_of(pod)
        pod = self.api.store.get(POD, namespace, name)
        classes = {c["metadata"]["name"]: c for c in self._all(CLASSES)}
        mapping = extended_resource_classes(list(classes.values()))
        requests, mappings = extended_requests(pod, mapping)
        extended: Object | None = None
        if requests:  # the claim exists only in memory until the pod is bound
            extended = {"metadata": {"name": f"{name}-extended-resources-"},
                        "spec": {"devices": {"requests": requests}}}  # fmt: skip
            claims = [*claims, extended]
        plugins = {n["metadata"]["name"]: n.get("status", {}).get("allocatable", {})
                   for n in self._all(NODES)}  # fmt: skip
        usage = Usage.of(self._all(CLAIMS))
        reasons = []
        for node, devices in sorted(self.devices().items()):
            advertised = plugins.get(node, {})
            served = sorted(m["resourceName"] for m in mappings
                            if quantity(str(advertised.get(m["resourceName"], 0))))  # fmt: skip
            if served:
                reasons.append(f"{node}: {served[0]} is its device plugin's (not followed)")
                continue
            placed: list[tuple[Object, list[Pick]]] = []
            for claim in claims:
                if "allocation" in claim.get("status", {}):
                    continue
                picks = allocate(claim, classes, devices, usage)
                if picks is None:
                    reasons.append(
                        f"{node}: cannot allocate all claims (claim {claim['metadata']['name']})"
                    )
                    break
                for pick in picks:
                    usage.add(pick.device.key, pick.amounts, shared=pick.device.shared)
                placed.append((claim, picks))
            else:
                if extended is not None:
                    placed = self._create_extended(pod, extended, mappings, placed)
                self._commit(pod, placed, classes, node)
                return node
            for _, picks in placed:  # this node's tentative picks given back
                for pick in picks:
                    usage.remove(pick.device.key, pick.amounts, shared=pick.device.shared)
        message = "; ".join(reasons) or "no node has devices"
        message = f"0/{len(self.devices())} nodes are available: {message}"
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": message}  # fmt: skip
        self._status(POD, namespace, name, conditions=[condition])
        raise Unschedulable(condition["message"])

    def _create_extended(
        self,
        pod: Object,
        extended: Object,
        mappings: list[Object],
        placed: list[tuple[Object, list[Pick]]],
    ) -> list[tuple[Object, list[Pick]]]:
        """The extended resources' claim created (as the scheduler's PreBind does) and named in
        the pod's status; ``placed`` with the created claim in place of the in-memory one."""
        meta = pod["metadata"]
        owner = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                 "controller": True, "blockOwnerDeletion": True}  # fmt: skip
        body: Object = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": extended["metadata"]["name"],
                "annotations": {EXTENDED_CLAIM: "true"},
                "ownerReferences": [owner],
            },
            "spec": copy.deepcopy(extended["spec"]),
        }
        created, _ = self.api.store.create(
            CLAIMS, meta["namespace"], body, strict=True, dry_run=False
        )
        status = {"requestMappings": mappings, "resourceClaimName": created["metadata"]["name"]}
        self._status(POD, meta["namespace"], meta["name"], extendedResourceClaimStatus=status)
        return [(created if c is extended else c, picks) for c, picks in placed]

    def _commit(
        self,
        pod: Object,
        placed: Sequence[tuple[Object, list[Pick]]],
        classes: Mapping[str, Mapping[str, Any]],
        node: str,
    ) -> None:
        meta = pod["metadata"]
        consumer = {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
        for claim, picks in placed:
            self._status(
                CLAIMS,
                meta["namespace"],
                claim["metadata"]["name"],
                allocation=allocation(claim, picks, classes, node),
            )
        names = {c["metadata"]["name"] for c in [*(c for c, _ in placed), *self.claims_of(pod)]}
        for claim in (self.api.store.get(CLAIMS, meta["namespace"], n) for n in sorted(names)):
            reserved = claim.get("status", {}).get("reservedFor", [])
            if consumer not in reserved:
                self._status(
                    CLAIMS, meta["namespace"], claim["metadata"]["name"],
                    reservedFor=[*reserved, consumer],
                )  # fmt: skip
        bound = self.api.store.get(POD, meta["namespace"], meta["name"])
        bound["spec"]["nodeName"] = node  # the binding subresource's effect
        condition = {"type": "PodScheduled", "status": "True"}
        bound["status"]["conditions"] = [condition]
        self.api.store.put(POD, meta["namespace"], bound)

    def schedule_pending(self) -> dict[str, str | None]:
        """Every pending pod with claims or extended resources backed by DRA tried once: pod
        name to node (None: unschedulable)."""
        placed: dict[str, str | None] = {}
        mapping = extended_resource_classes(self._all(CLASSES))
        for pod in self._all(POD):
            if pod["spec"].get("nodeName"):
                continue
            if not pod["spec"].get("resourceClaims") and not extended_requests(pod, mapping)[0]:
                continue
            meta = pod["metadata"]
            try:
                placed[meta["name"]] = self.schedule(meta["namespace"], meta["name"])
            except Unschedulable:
                placed[meta["name"]] = None
        return placed

    def release_claims(self) -> list[str]:
        """The claims of pods that are gone or ended released, deallocated and, where a pod
        owned them, deleted (module docstring): the names of the claims deleted."""
        pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self._all(POD)}

        def live(namespace: str, name: str, uid: str) -> bool:
            pod = pods.get((namespace, name))
            if pod is None or pod["metadata"]["uid"] != uid:
                return False
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return False
            return not (
                pod["metadata"].get("deletionTimestamp") and not pod["spec"].get("nodeName")
            )

        deleted = []
        for claim in self._all(CLAIMS):
            meta, status = claim["metadata"], claim.get("status", {})
            namespace = meta["namespace"]
            reserved = status.get("reservedFor", [])
            kept = [
                c
                for c in reserved
                if c.get("resource") != "pods" or live(namespace, c["name"], c["uid"])
            ]
            if kept != reserved or (not kept and "allocation" in status):
                self._release(namespace, meta["name"], kept)
            owners = [o for o in meta.get("ownerReferences", [])
                      if o.get("kind") == "Pod" and o.get("controller")]  # fmt: skip
            if owners and not live(namespace, owners[0]["name"], owners[0]["uid"]):
                self.api.store.delete(CLAIMS, namespace, meta["name"])
                deleted.append(meta["name"])
        return deleted

    def _release(self, namespace: str, name: str, kept: list[Object]) -> None:
        """The claim reserved for ``kept`` only; deallocated when that is no one."""

        def change(current: Object) -> Object:
            status = current.setdefault("status", {})
            status["reservedFor"] = kept
            if not kept:
                status.pop("reservedFor")
                status.pop("allocation", None)
            return current

        self.api.store.update(
            CLAIMS, namespace, name, change, subresource="status", strict=True, dry_run=False
        )
