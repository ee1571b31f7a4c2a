"""Weights when a GPU's limits add up past 100 % (issue 13): the formula, and the daemon
publishing each pod's effective limit into its region."""

import time
from pathlib import Path

import pytest
from vgpu_common.limits import Qos
from vgpu_hypervisor.daemon.pods import PodRecord
from vgpu_hypervisor.daemon.scheduler import effective_limits, node_effective_limits, weight_of
from vgpu_limiter.region import DeviceInfo, ffi, open_region

from tests.hypervisor.conftest import Daemon, wait_for

CREATED_NS = ffi.offsetof("struct vgpu_region", "created_ns")


def test_limits_that_fit_hold_as_they_are() -> None:
    assert effective_limits({"a": (3000, 2), "b": (7000, 1), "c": (0, 8)}) == {
        "a": 3000,
        "b": 7000,
        "c": 0,
    }


@pytest.mark.parametrize(
    ("pods", "wanted"),
    [
        # Equal weights: in proportion to the limits.
        ({"a": (6000, 2), "b": (6000, 2)}, {"a": 5000, "b": 5000}),
        # High (4) against low (1): 80/20 by the formula, but never past a limit: 60, then 40.
        ({"a": (6000, 4), "b": (6000, 1)}, {"a": 6000, "b": 4000}),
        # Three pods, one capped, the rest shared by weight * limit among the others.
        (
            {"a": (2000, 8), "b": (6000, 2), "c": (6000, 2)},
            {"a": 2000, "b": 4000, "c": 4000},
        ),
        # Four pods, critical first.
        (
            {"a": (5000, 8), "b": (5000, 4), "c": (5000, 2), "d": (5000, 1)},
            {"a": 5000, "b": 2857, "c": 1428, "d": 714},
        ),
    ],
)
def test_oversubscribed_shares(pods: dict[str, tuple[int, int]], wanted: dict[str, int]) -> None:
    got = effective_limits(pods)
    assert got == wanted
    assert sum(got.values()) <= 10000


def test_weights_from_the_class() -> None:
    assert [weight_of(qos, 0) for qos in range(4)] == [1, 2, 4, 8]
    assert weight_of(0, 5) == 5


def _pod(name: str, *gpus: tuple[str, int], qos: int = Qos.LOW) -> PodRecord:
    devices = tuple(
        DeviceInfo(index, uuid, 0, 0, compute, generation=0)
        for index, (uuid, compute) in enumerate(gpus)
    )
    return PodRecord("ml", name, Path("/none") / name, devices=devices, qos=qos, weight=9)


def test_the_node_s_policy_is_a_function_of_the_pods_and_their_held_policies() -> None:
    """Pods are weighed per GPU by UUID (whatever their entries' order), by the class and weight
    the daemon holds, never by the words in their records; an unreadable pod takes no part."""
    gpu0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
    gpu1 = "GPU-bbbbbbbb-1111-1111-1111-111111111111"
    records = [
        _pod("hi", (gpu0, 6000), (gpu1, 3000)),
        _pod("lo", (gpu1, 5000), (gpu0.upper(), 6000), qos=Qos.HIGH),
        PodRecord("ml", "bad", Path("/none/bad"), error="truncated"),
    ]
    policies = {("ml", "hi"): (Qos.HIGH, 0), ("ml", "lo"): (Qos.LOW, 0), ("ml", "bad"): (0, 9)}
    assert node_effective_limits(records, policies) == {
        ("ml", "hi"): {0: 6000, 1: 3000},  # GPU 1's limits fit: each holds
        ("ml", "lo"): {0: 5000, 1: 4000},
    }
    assert node_effective_limits(records, {}) == {}  # no policy held: nothing weighed


def test_the_daemon_publishes_effective_limits(daemon: Daemon) -> None:
    for name, qos in (("hi", "high"), ("lo", "low")):
        created = daemon.cli("pods", "create", name, "--compute", "0=60", "--qos", qos, "--json")
        assert created.returncode == 0, created.stderr
    regions = {name: open_region(daemon.base / "default" / name / "shm") for name in ("hi", "lo")}
    try:
        wait_for(lambda: regions["lo"].effective(0) == 4000, timeout=10)
        assert regions["hi"].effective(0) == 6000
        # Weights change live: equal weights give 50/50.
        assert daemon.cli("pods", "update", "lo", "--weight", "4").returncode == 0
        wait_for(lambda: regions["lo"].effective(0) == 5000, timeout=10)
        assert regions["hi"].effective(0) == 5000
        pod = daemon.http.get("/api/v1/pods/default/lo").json()
        assert (pod["qos"], pod["weight"]) == ("low", 4)
    finally:
        for region in regions.values():
            region.close()
    bad = daemon.cli("pods", "update", "lo", "--qos", "urgent")
    assert bad.returncode == 2
    assert "--qos 'urgent': expected low, medium, high or critical" in bad.stderr


def test_a_weight_a_tenant_writes_into_its_region_takes_nothing_from_others(
    daemon: Daemon,
) -> None:
    """The region is the tenant's to write; the class and weight are the daemon's: one written
    there is set back and never weighs in the division of an oversubscribed GPU."""
    for name in ("honest", "greedy"):
        created = daemon.cli("pods", "create", name, "--compute", "0=60", "--qos", "low")
        assert created.returncode == 0, created.stderr
    regions = {n: open_region(daemon.base / "default" / n / "shm") for n in ("honest", "greedy")}
    try:
        wait_for(lambda: regions["greedy"].effective(0) == 5000, timeout=10)
        regions["greedy"].set_policy(3, 1_000_000)  # critical, and the largest weight
        wait_for(lambda: (regions["greedy"].qos, regions["greedy"].weight) == (0, 0), timeout=10)
        time.sleep(1.5)  # a few passes
        assert regions["greedy"].effective(0) == regions["honest"].effective(0) == 5000
        # The header is the tenant's to write too: a new creation time makes it no new pod.
        path = daemon.base / "default" / "greedy" / "shm"
        with path.open("r+b") as region_file:
            region_file.seek(CREATED_NS)
            stamp = int.from_bytes(region_file.read(8), "little")
            region_file.seek(CREATED_NS)
            region_file.write((stamp + 1).to_bytes(8, "little"))
        regions["greedy"].set_policy(3, 1_000_000)
        wait_for(lambda: (regions["greedy"].qos, regions["greedy"].weight) == (0, 0), timeout=10)
        time.sleep(1.5)
        assert regions["greedy"].effective(0) == regions["honest"].effective(0) == 5000
        # The admin's change through the API still holds.
        assert daemon.cli("pods", "update", "greedy", "--weight", "3").returncode == 0
        wait_for(lambda: regions["honest"].effective(0) == 4000, timeout=10)
        assert regions["greedy"].effective(0) == 6000
    finally:
        for region in regions.values():
            region.close()
