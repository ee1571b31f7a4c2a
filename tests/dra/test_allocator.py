"""The stand-in for the scheduler's DRA allocation (allocator.py) checked against the rules of
consumable capacity, each stated here on its own terms (a brute-force search of the valid
amounts), for generated devices, request policies and claims: no shared device's capacity is
ever exceeded, each share consumes the smallest valid amount at least what it asked (the
policy's default, or the whole capacity, when it asked none), a device that is not shared is
given once, and a claim is refused only when no device could take it."""

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.dra.allocator import (
    Device,
    Pick,
    Unsupported,
    Usage,
    allocate,
    cel_matches,
    consumed_amount,
    extended_requests,
    extended_resource_classes,
)

DRIVER = "example.com"
CLASSES = {
    "any": {"spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
}
NAMES = ("memory", "compute")


@st.composite
def capacities(draw: st.DrawFn) -> dict[str, Any]:
    value = draw(st.integers(1, 40))
    shape = draw(st.sampled_from(["none", "values", "range"]))
    if shape == "none":
        return {"value": str(value)}
    if shape == "values":
        valid = sorted(draw(st.sets(st.integers(1, value), min_size=1, max_size=5)))
        default = draw(st.sampled_from(valid))
        return {
            "value": str(value),
            "requestPolicy": {"default": str(default), "validValues": [str(v) for v in valid]},
        }
    low = draw(st.integers(0, value - 1))
    span: dict[str, str] = {"min": str(low)}
    if draw(st.booleans()):
        span["step"] = str(draw(st.integers(1, value)))
    if draw(st.booleans()):
        span["max"] = str(draw(st.integers(max(low, 1), value)))
    default = draw(st.integers(max(low, 1), int(span.get("max", value))))
    return {"value": str(value), "requestPolicy": {"default": str(default), "validRange": span}}


@st.composite
def devices(draw: st.DrawFn) -> list[Device]:
    made = []
    for index in range(draw(st.integers(1, 3))):
        names = draw(st.sets(st.sampled_from(NAMES), min_size=1))
        spec = {
            "name": f"dev-{index}",
            "allowMultipleAllocations": draw(st.booleans() | st.just(True)),
            "capacity": {name: draw(capacities()) for name in sorted(names)},
        }
        made.append(Device(DRIVER, "pool", "node", spec))
    return made


@st.composite
def claims(draw: st.DrawFn) -> dict[str, Any]:
    requests = []
    for index in range(draw(st.integers(1, 2))):
        asked = draw(st.dictionaries(st.sampled_from(NAMES), st.integers(0, 45).map(str)))
        exact: dict[str, Any] = {"deviceClassName": "any", "count": draw(st.integers(1, 2))}
        if asked:
            exact["capacity"] = {"requests": asked}
        requests.append({"name": f"r{index}", "exactly": exact})
    return {"spec": {"devices": {"requests": requests}}}


def valid(capacity: dict[str, Any], amount: int) -> bool:
    """Whether the device's policy allows consuming ``amount``."""
    policy = capacity.get("requestPolicy", {})
    if "validValues" in policy:
        return str(amount) in policy["validValues"]
    span = policy.get("validRange")
    if span is None:
        return True
    low = int(span["min"])
    return (
        amount >= low
        and ("max" not in span or amount <= int(span["max"]))
        and ("step" not in span or (amount - low) % int(span["step"]) == 0)
    )


def expected(capacity: dict[str, Any], asked: str | None) -> int | None:
    """What a request consumes, by the rules' words: the whole capacity or the policy's
    default when it asks none, else the smallest valid amount at least what it asked."""
    if asked is None:
        return int(capacity.get("requestPolicy", {}).get("default", capacity["value"]))
    top = max(int(capacity["value"]), int(asked))
    return next((x for x in range(int(asked), top + 1) if valid(capacity, x)), None)


def wanted(device: Device, asked: dict[str, str]) -> dict[str, int] | None:
    capacity = device.spec["capacity"]
    if set(asked) - set(capacity):
        return None
    if not device.shared:  # given whole: a capacity request only filters
        return {} if all(int(v) <= int(capacity[k]["value"]) for k, v in asked.items()) else None
    amounts = {name: expected(one, asked.get(name)) for name, one in capacity.items()}
    if None in amounts.values():
        return None
    return {k: v for k, v in amounts.items() if v is not None}


def holding(usage: Usage, devs: list[Device]) -> dict[Any, dict[str, int]]:
    return {d.key: {k: v for k, v in usage.consumed.get(d.key, {}).items() if v} for d in devs}


def check_refusal(
    claim: dict[str, Any], devs: list[Device], held: dict[Any, dict[str, int]], taken: set[Any]
) -> None:
    """A claim of one device refused: no device could take it."""
    requests = claim["spec"]["devices"]["requests"]
    if len(requests) != 1 or requests[0]["exactly"]["count"] != 1:
        return  # several devices at once: not brute-forced here
    one = requests[0]["exactly"].get("capacity", {}).get("requests", {})
    for device in devs:
        amounts = wanted(device, one)
        if amounts is None or device.key in taken:
            continue
        assert device.shared, device  # not taken, not shared: it was free
        limits = device.capacities()
        assert any(held[device.key].get(n, 0) + a > limits[n] for n, a in amounts.items()), (
            device,
            one,
            held,
        )


def check_totals(granted: list[Pick], devs: list[Device]) -> None:
    """Never more than a shared device holds; a device not shared given once."""
    total: dict[Any, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    whole: list[Any] = []
    for pick in granted:
        if pick.device.shared:
            for name, amount in pick.amounts.items():
                total[pick.device.key][name] += amount
        else:
            whole.append(pick.device.key)
    for device in devs:
        for name, limit in device.capacities().items():
            assert total[device.key][name] <= limit, (device, granted)
    assert len(whole) == len(set(whole))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(devices(), st.lists(claims(), min_size=1, max_size=8))
def test_allocations_follow_the_consumable_capacity_rules(
    devs: list[Device], asked: list[dict[str, Any]]
) -> None:
    usage = Usage(defaultdict(lambda: defaultdict(int)), set())
    granted: list[Pick] = []
    for claim in asked:
        held, taken = holding(usage, devs), set(usage.taken)
        picks = allocate(claim, CLASSES, devs, usage)
        assert holding(usage, devs) == held and usage.taken == taken  # left as it was
        if picks is None:
            check_refusal(claim, devs, held, taken)
            continue
        requests = claim["spec"]["devices"]["requests"]
        assert sorted(p.request for p in picks) == sorted(
            r["name"] for r in requests for _ in range(r["exactly"]["count"])
        )
        for pick in picks:
            request = next(r for r in requests if r["name"] == pick.request)
            one = request["exactly"].get("capacity", {}).get("requests", {})
            assert pick.amounts == wanted(pick.device, one), (pick, one)
            usage.add(pick.device.key, pick.amounts, shared=pick.device.shared)
        granted += picks
        check_totals(granted, devs)


def test_first_fit_in_slice_order_and_a_full_device_passed_over() -> None:
    gpu = {
        "memory": {
            "value": "10",
            "requestPolicy": {"default": "10", "validRange": {"min": "1", "step": "1"}},
        }
    }
    devs = [
        Device(
            DRIVER,
            "pool",
            "node",
            {"name": f"gpu-{i}", "allowMultipleAllocations": True, "capacity": gpu},
        )
        for i in (0, 1)
    ]
    claim = {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "any",
                            "capacity": {"requests": {"memory": "4"}},
                        },
                    }
                ]
            }
        }
    }
    usage = Usage(defaultdict(lambda: defaultdict(int)), set())
    placed = []
    for _ in range(4):
        picks = allocate(claim, CLASSES, devs, usage)
        assert picks is not None
        (pick,) = picks
        usage.add(pick.device.key, pick.amounts, shared=True)
        placed.append(pick.device.spec["name"])
    assert placed == ["gpu-0", "gpu-0", "gpu-1", "gpu-1"]
    assert allocate(claim, CLASSES, devs, usage) is None  # 2 + 2 left: 4 fits nowhere


def test_a_tainted_device_is_passed_over_unless_tolerated() -> None:
    capacity = {"memory": {"value": "10"}}
    taint = {"key": "gpu.vgpu.io/unhealthy", "effect": "NoSchedule"}
    devs = [
        Device(DRIVER, "pool", "node", {"name": "gpu-0", "capacity": capacity, "taints": [taint]}),
        Device(DRIVER, "pool", "node", {"name": "gpu-1", "capacity": capacity}),
    ]

    def claim(*tolerations: dict[str, str]) -> dict[str, Any]:
        exactly = {"deviceClassName": "any", "tolerations": list(tolerations)}
        return {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}

    def placed(one: dict[str, Any], among: list[Device]) -> str | None:
        picks = allocate(one, CLASSES, among, Usage(defaultdict(lambda: defaultdict(int)), set()))
        return None if picks is None else picks[0].device.spec["name"]

    assert placed(claim(), devs) == "gpu-1"
    assert placed(claim(), devs[:1]) is None
    tolerated = [
        {"key": "gpu.vgpu.io/unhealthy", "operator": "Exists"},
        {"key": "gpu.vgpu.io/unhealthy", "operator": "Equal", "value": ""},
        {"operator": "Exists", "effect": "NoSchedule"},
    ]
    for toleration in tolerated:
        assert placed(claim(toleration), devs[:1]) == "gpu-0", toleration
    not_tolerated = [
        {"key": "other", "operator": "Exists"},
        {"key": "gpu.vgpu.io/unhealthy", "operator": "Exists", "effect": "NoExecute"},
        {"key": "gpu.vgpu.io/unhealthy", "value": "x"},
    ]
    for toleration in not_tolerated:
        assert placed(claim(toleration), devs[:1]) is None, toleration


def test_rounding_by_the_policy() -> None:
    ranged = {
        "value": "100",
        "requestPolicy": {"default": "10", "validRange": {"min": "10", "max": "50", "step": "5"}},
    }
    assert consumed_amount(ranged, None) == 10
    assert consumed_amount(ranged, "3") == 10  # up to the minimum
    assert consumed_amount(ranged, "11") == 15  # up to min + n * step
    assert consumed_amount(ranged, "50") == 50
    assert consumed_amount(ranged, "51") is None  # above max: the device does not fit
    listed = {"value": "8", "requestPolicy": {"default": "2", "validValues": ["1", "2", "4"]}}
    assert consumed_amount(listed, "3") == 4
    assert consumed_amount(listed, "5") is None
    assert consumed_amount({"value": "7"}, None) == 7  # no policy, nothing asked: all of it


DEVICE = {
    "name": "gpu-0",
    "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}, "index": {"int": 0}},
    "capacity": {"memory": {"value": "80Gi"}},
}


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        ('device.driver == "gpu.vgpu.io"', True),
        ('device.driver == "other.io"', False),
        ('device.attributes["gpu.vgpu.io"].productName.matches("H100")', True),
        ('device.attributes["gpu.vgpu.io"].productName.matches("A100")', False),
        ('device.attributes["gpu.vgpu.io"].index == 0', True),
        ('device.attributes["gpu.vgpu.io"].index == 1', False),
        ('device.attributes["gpu.vgpu.io"].uuid == "x"', False),  # no such attribute
        ('device.attributes["other.io"].index == 0', False),
        ('device.capacity["gpu.vgpu.io"].memory.compareTo(quantity("40Gi")) >= 0', True),
        ('device.capacity["gpu.vgpu.io"].memory.compareTo(quantity("96Gi")) >= 0', False),
        ('device.driver == "gpu.vgpu.io" && device.attributes["gpu.vgpu.io"].index == 1', False),
    ],
)
def test_the_cel_subset(expression: str, matches: bool) -> None:
    assert cel_matches(expression, "gpu.vgpu.io", DEVICE) is matches


def test_cel_outside_the_subset_is_refused_not_guessed() -> None:
    with pytest.raises(Unsupported, match="not in the stand-in's subset"):
        cel_matches('device.attributes["gpu.vgpu.io"].index > 0', "gpu.vgpu.io", DEVICE)


def device_class(name: str, created: str, resource: str | None = None) -> dict[str, Any]:
    spec = {} if resource is None else {"extendedResourceName": resource}
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def test_an_extended_resource_maps_to_the_newest_class_then_the_first_by_name() -> None:
    classes = [
        device_class("b", "2026-01-02T00:00:00Z", "example.com/gpu"),
        device_class("a", "2026-01-02T00:00:00Z", "example.com/gpu"),
        device_class("old", "2026-01-01T00:00:00Z", "example.com/gpu"),
        device_class("plain", "2026-01-03T00:00:00Z"),
    ]
    assert extended_resource_classes(classes) == {
        "example.com/gpu": "a",
        **{f"deviceclass.resource.kubernetes.io/{n}": n for n in ("a", "b", "old", "plain")},
    }


def test_one_request_per_container_and_resource_named_by_their_indexes() -> None:
    def container(name: str, **asked: str) -> dict[str, Any]:
        return {"name": name, "resources": {"limits": asked}}

    pod = {"spec": {"containers": [
        container("a", **{"example.com/gpu": "2", "cpu": "1", "zz.io/x": "1"}),
        container("b", **{"example.com/gpu": "0"}),  # nothing asked: no request
        container("c", **{"example.com/gpu": "1", "example.com/fpga": "3"}),
    ]}}  # fmt: skip
    mapping = {"example.com/gpu": "gpus", "example.com/fpga": "fpgas"}
    requests, mappings = extended_requests(pod, mapping)
    exact = [(r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in requests]
    assert exact == [
        ("container-0-request-1", "gpus", 2),  # after cpu, in name order
        ("container-2-request-0", "fpgas", 3),
        ("container-2-request-1", "gpus", 1),
    ]
    assert [(m["containerName"], m["resourceName"], m["requestName"]) for m in mappings] == [
        ("a", "example.com/gpu", "container-0-request-1"),
        ("c", "example.com/fpga", "container-2-request-0"),
        ("c", "example.com/gpu", "container-2-request-1"),
    ]
    pod["spec"]["initContainers"] = [container("init", **{"example.com/gpu": "1"})]
    with pytest.raises(Unsupported, match="init containers"):
        extended_requests(pod, mapping)
