"""Weights when the limits of the pods that want a GPU add up past what it gives: the formula,
who counts as wanting the GPU, and the daemon publishing each pod's effective limit into its
region."""

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu_common.limits import Qos
from vgpu_hypervisor.daemon.demand import Demand, DemandTracker
from vgpu_hypervisor.daemon.pods import PodRecord, _decode_policies, _encode_policies
from vgpu_hypervisor.daemon.scheduler import (
    SHARED_CAPACITY,
    burst_rates,
    effective_limits,
    node_burst_rates,
    node_effective_limits,
    weight_of,
)
from vgpu_limiter.region import DeviceInfo, ProcessInfo, ffi, open_region

from tests.hypervisor.conftest import Daemon, wait_for
from tests.limiter.test_scheduling import share_between

CREATED_NS = ffi.offsetof("struct vgpu_region", "created_ns")


def test_limits_that_fit_hold_as_they_are() -> None:
    """Up to what a shared GPU gives (98 %: its hand-overs leave it idle the rest), and a pod
    alone up to its whole limit."""
    assert effective_limits({"a": (3000, 2), "b": (6800, 1), "c": (0, 8)}) == {
        "a": 3000,
        "b": 6800,
        "c": 0,
    }
    assert effective_limits({"a": (9900, 2), "c": (0, 8)}) == {"a": 9900, "c": 0}


@pytest.mark.parametrize(
    ("limits", "wanted"),
    [((3000, 7000), (2940, 6860)), ((2000, 3000, 5000), (1960, 2940, 4900))],
)
def test_pods_that_ask_for_the_whole_gpu_share_the_hand_overs_loss(
    limits: tuple[int, ...], wanted: tuple[int, ...]
) -> None:
    """Limits that add up to 100 % ask for more than a GPU several pods take turns on can give:
    each gives up the same share of its limit, rather than the largest pod all of it."""
    pods = {str(index): (limit, 2) for index, limit in enumerate(limits)}
    assert tuple(effective_limits(pods).values()) == wanted


@pytest.mark.parametrize(
    ("pods", "wanted"),
    [
        # Equal weights: in proportion to the limits, of the 98 % a shared GPU gives.
        ({"a": (6000, 2), "b": (6000, 2)}, {"a": 4900, "b": 4900}),
        # High (4) against low (1): 80/20 by the formula, but never past a limit: 60, then 38.
        ({"a": (6000, 4), "b": (6000, 1)}, {"a": 6000, "b": 3800}),
        # Three pods, one capped, the rest shared by weight * limit among the others.
        (
            {"a": (2000, 8), "b": (6000, 2), "c": (6000, 2)},
            {"a": 2000, "b": 3900, "c": 3900},
        ),
        # Four pods, critical first.
        (
            {"a": (5000, 8), "b": (5000, 4), "c": (5000, 2), "d": (5000, 1)},
            {"a": 5000, "b": 2742, "c": 1371, "d": 685},
        ),
    ],
)
def test_oversubscribed_shares(pods: dict[str, tuple[int, int]], wanted: dict[str, int]) -> None:
    got = effective_limits(pods)
    assert got == wanted
    assert sum(got.values()) <= SHARED_CAPACITY


@pytest.mark.parametrize(
    ("pods", "usage", "wanted"),
    [
        # A 50 % pod that uses 4.6 beside a busy 30/70 pair: before, 1960 / 4573 / 3266 (the
        # pair at 20/46, the GPU 30 % idle); now it keeps its limit and the pair shares the rest.
        (
            {"a": (3000, 2), "b": (7000, 2), "light": (5000, 2)},
            {"a": 2940, "b": 6860, "light": 460},
            {"a": 2802, "b": 6538, "light": 5000},
        ),
        # Two busy 60 % pods beside one that uses 17 (was 3500 each with the GPU 85 % busy).
        (
            {"a": (6000, 2), "b": (6000, 2), "light": (5000, 2)},
            {"a": 4900, "b": 4900, "light": 1700},
            {"a": 4050, "b": 4050, "light": 5000},
        ),
        # Held back by their effective limits, pods use about all of them: none is light, and
        # what they get holds (the headroom keeps it from swinging).
        ({"a": (6000, 2), "b": (6000, 2)}, {"a": 4880, "b": 4900}, {"a": 4900, "b": 4900}),
        # Not measured yet: counted at the whole limit (with "a" at 10 % of 60, both fit).
        ({"a": (6000, 2), "b": (6000, 2)}, {"a": 1000}, {"a": 6000, "b": 6000}),
        (
            {"a": (6000, 2), "b": (6000, 2), "c": (5000, 2)},
            {"a": 1000},
            {"a": 6000, "b": 4800, "c": 4000},
        ),
    ],
)
def test_a_pod_that_uses_less_than_its_share_takes_only_what_it_uses(
    pods: dict[str, tuple[int, int]], usage: dict[str, int], wanted: dict[str, int]
) -> None:
    assert effective_limits(pods, usage) == wanted


@given(
    st.dictionaries(
        st.sampled_from("abcdef"),
        st.tuples(st.integers(1, 9999), st.sampled_from([1, 2, 4, 8]), st.integers(0, 9999)),
        min_size=1,
    )
)
def test_effective_limits_never_pass_a_limit_nor_what_the_gpu_gives(
    pods: dict[str, tuple[int, int, int]],
) -> None:
    """Whatever the pods use: no pod above its limit, and the pods held below their limits
    (the others keep theirs) get no more together than the GPU gives less what the others use."""
    limits = {key: (limit, weight) for key, (limit, weight, _) in pods.items()}
    usage = {key: min(used, limit) for key, (limit, _, used) in pods.items()}
    got = effective_limits(limits, usage)
    assert all(0 < got[key] <= limit for key, (limit, _) in limits.items())
    held = [key for key, (limit, _) in limits.items() if got[key] < limit]
    free = [key for key in limits if key not in held]
    capacity = SHARED_CAPACITY if len(limits) > 1 else 10000
    assert sum(got[key] for key in held) <= capacity - sum(usage[key] for key in free) + len(held)


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
    everyone = {(pod, index) for pod in policies for index in (0, 1)}
    assert node_effective_limits(records, policies, everyone) == {
        ("ml", "hi"): {0: 6000, 1: 3000},  # GPU 1's limits fit: each holds
        ("ml", "lo"): {0: 5000, 1: 3800},
    }
    assert node_effective_limits(records, {}, everyone) == {}  # no policy held: nothing weighed
    # A pod that does not want a GPU takes nothing there: "lo" alone wants GPU 0 (its entry 1)
    # and keeps its 60 %, where it got 38 beside "hi".
    assert node_effective_limits(records, policies, everyone - {(("ml", "hi"), 0)}) == {
        ("ml", "hi"): {0: 0, 1: 3000},
        ("ml", "lo"): {0: 5000, 1: 6000},
    }


def _counted(
    name: str, gpu_ns: int, throttled_ns: int, live: bool = True, **freeze: Any
) -> PodRecord:
    device = DeviceInfo(0, "GPU-0", 0, 0, 5000, 0, gpu_ns=gpu_ns, throttled_ns=throttled_ns)
    process = ProcessInfo(0, 1, 1, 0, 0, 0)
    return PodRecord(
        "ml",
        name,
        Path("/none") / name,
        devices=(device,),
        processes=(process,) if live else (),
        **freeze,
    )


MS = 1_000_000


def test_a_pod_wants_a_gpu_while_it_launches_or_waits_there() -> None:
    now = [10**12]
    demand = DemandTracker(clock=lambda: now[0])
    busy, late = (("ml", "busy"), 0), (("ml", "late"), 0)
    # First seen (every pod, after the daemon restarts): nobody wants it yet, not even a pod
    # with a live process; counted for that alone, idle pods divided the GPU for a pass.
    first = demand.observe([_counted("busy", 5, 0), _counted("made", 0, 0, live=False)])
    assert first.wanting == set()
    # Then a counter that moved counts: GPU time, or time waited for its share.
    now[0] += 100 * MS
    assert demand.observe(
        [_counted("busy", 9, 0), _counted("made", 0, 0, live=False), _counted("late", 0, 0)]
    ).wanting == {busy}
    now[0] += 100 * MS
    assert demand.observe(
        [_counted("busy", 9, 4), _counted("made", 0, 0), _counted("late", 1, 0)]
    ).wanting == {busy, late}
    # Within a second of its last move it still wants the GPU, however soon the next pass.
    now[0] += 900 * MS
    assert demand.observe(
        [_counted("busy", 9, 4), _counted("made", 0, 0), _counted("late", 1, 0)]
    ).wanting == {busy, late}
    # Idle a second (a sleeping process, a frozen pod): wants nothing; nor does a pod whose
    # processes exited, whatever its counters did before they went.
    now[0] += 100 * MS
    assert demand.observe([_counted("busy", 9, 4), _counted("late", 1, 0)]).wanting == set()
    now[0] += 100 * MS
    assert demand.observe([_counted("busy", 12, 4, live=False)]).wanting == set()
    bad = PodRecord("ml", "bad", Path("/none/bad"), error="truncated")
    assert demand.observe([bad]).wanting == set()


@pytest.mark.parametrize(
    "freeze", [{"frozen": True}, {"frozen": True, "frozen_gpus": ("gpu-0",)}], ids=["pod", "gpu"]
)
def test_a_frozen_pod_wants_nothing_from_the_pass_that_sees_it_frozen(
    freeze: dict[str, Any],
) -> None:
    """Before, a frozen pod counted for up to a second after its freeze (its counters had
    moved lately, and its backlog drained after it): a 60 % pod beside it was held to 49. A
    freeze of another GPU leaves it wanting this one."""
    now = [10**12]
    demand = DemandTracker(clock=lambda: now[0])
    key = (("ml", "b"), 0)
    demand.observe([_counted("b", 0, 0)])  # first seen
    for step in range(1, 4):
        now[0] += 100 * MS
        assert demand.observe([_counted("b", step * 60 * MS, 0)]).wanting == {key}
    now[0] += 100 * MS
    assert demand.observe([_counted("b", 4 * 60 * MS, 0, **freeze)]).wanting == set()
    elsewhere: dict[str, Any] = {"frozen": True, "frozen_gpus": ("gpu-1",)}
    now[0] += 100 * MS
    assert demand.observe([_counted("b", 5 * 60 * MS, 0, **elsewhere)]).wanting == {key}
    # Thawed: measured afresh from its first move.
    now[0] += 100 * MS
    assert demand.observe([_counted("b", 5 * 60 * MS, 0, **freeze)]).wanting == set()
    now[0] += 100 * MS
    thawed = demand.observe([_counted("b", 6 * 60 * MS, 0)])
    assert thawed.wanting == {key} and key not in thawed.usage


def test_passes_milliseconds_apart_see_busy_pods_as_busy() -> None:
    """Passes also run after every API change and Kubernetes event. Judged pass to pass, two
    busy 60 % pods whose counters move as their 32-ms epochs end were seen idle in half of
    twenty quick passes, and the GPU was left undivided until the next periodic pass."""
    now = [10**12]
    demand = DemandTracker(clock=lambda: now[0])
    gpu = {"a": 0, "b": 16 * MS}
    demand.observe([_counted(name, used, 0) for name, used in gpu.items()])
    for step in range(400):  # 2 s, a pass every 5 ms
        now[0] += 5 * MS
        if step % 6 == 0:  # an epoch of each ends every 32 ms or so
            gpu = {name: used + 16 * MS for name, used in gpu.items()}
        seen = demand.observe([_counted(name, used, 0) for name, used in gpu.items()])
        if step > 0:
            assert seen.wanting == {(("ml", "a"), 0), (("ml", "b"), 0)}, step
    # Their use, measured over windows of a second or so however often the passes come.
    assert seen.usage == {(("ml", "a"), 0): pytest.approx(5300, abs=300)} | {
        (("ml", "b"), 0): pytest.approx(5300, abs=300)
    }


def test_a_pods_use_is_its_gpu_time_since_it_started_to_want_the_gpu() -> None:
    now = [10**12]
    demand = DemandTracker(clock=lambda: now[0])
    demand.observe([_counted("a", 0, 0), _counted("b", 0, 0)])
    # Both start: counted at their whole limit (no use yet) until a window of their work.
    now[0] += 500 * MS
    seen = demand.observe([_counted("a", 1, 0), _counted("b", 1, 0)])
    assert len(seen.wanting) == 2 and seen.usage == {}
    now[0] += 10**9  # a second: 170 ms of GPU time is 17 %
    seen = demand.observe([_counted("a", 170 * MS + 1, 0), _counted("b", 10**8 + 1, 5 * 10**7)])
    assert seen.usage == {(("ml", "a"), 0): 1700, (("ml", "b"), 0): 1000}
    # b stops for two seconds and wakes: its use is measured afresh, not over its idle time
    # (a pod woken at 70 % read as 35 gave a bursting pod the rest).
    now[0] += 2 * 10**9
    demand.observe([_counted("a", 510 * MS, 0), _counted("b", 10**8 + 1, 5 * 10**7)])
    now[0] += 100 * MS
    seen = demand.observe([_counted("a", 527 * MS, 0), _counted("b", 170 * MS, 5 * 10**7)])
    assert (("ml", "b"), 0) in seen.wanting and (("ml", "b"), 0) not in seen.usage
    assert seen.measuring  # the daemon's next pass comes within a quarter of a second
    # Its first use is measured over that quarter second; later ones over a second or so.
    now[0] += 250 * MS
    seen = demand.observe([_counted("a", 570 * MS, 0), _counted("b", 345 * MS, 5 * 10**7)])
    assert seen.usage[(("ml", "b"), 0)] == 7000 and not seen.measuring
    now[0] += 500 * MS
    seen = demand.observe([_counted("a", 655 * MS, 0), _counted("b", 695 * MS, 5 * 10**7)])
    assert seen.usage[(("ml", "b"), 0)] == 7000  # the quarter second's, until a whole window


def test_a_pod_made_anew_under_the_same_name_is_first_seen_again() -> None:
    """Its counters start again from 0: taken for the old pod's, the new one read a use of 0
    for a window while it ran at 60 %."""
    now = [10**12]
    demand = DemandTracker(clock=lambda: now[0])
    for step in range(3):
        now[0] += 500 * MS
        demand.observe([_counted("p", (step + 1) * 300 * MS, 0)])
    now[0] += 500 * MS
    assert demand.observe([_counted("p", 10 * MS, 0)]).wanting == set()  # made anew
    now[0] += 250 * MS
    seen = demand.observe([_counted("p", 160 * MS, 0)])
    assert seen.wanting == {(("ml", "p"), 0)} and seen.usage == {}


def test_a_first_use_holds_an_epoch_of_a_pod_at_a_low_limit() -> None:
    """A pod at 10 % ends an epoch every 320 ms: its first use waits for one to end after the
    one that woke it, rather than reading 0 over a quarter second without one."""
    now = [10**12]
    demand = DemandTracker(clock=lambda: now[0])
    demand.observe([_counted("low", 0, 0)])
    now[0] += 100 * MS
    demand.observe([_counted("low", 32 * MS, 0)])  # it wakes: an epoch ended
    now[0] += 250 * MS
    seen = demand.observe([_counted("low", 32 * MS, 0)])
    assert seen.measuring and seen.usage == {}
    now[0] += 100 * MS  # the next epoch ends 320 ms after the first
    seen = demand.observe([_counted("low", 64 * MS, 0)])
    assert seen.usage == {(("ml", "low"), 0): 914} and not seen.measuring  # 32 ms in 350


def test_a_pod_that_waited_much_of_its_window_is_held_not_light() -> None:
    """A pod whose launches waited a tenth of its window or more (for its share, or for
    another pod's epoch) would use more than it did: it is weighed at its limit, not at its
    use. Weighed at its use, a critical pod at 90 that woke beside a bursting pod read a few
    points under its limit, left the burster its rate, and was held there for seconds."""
    now = [10**12]
    demand = DemandTracker(clock=lambda: now[0])
    crit, light = (("ml", "crit"), 0), (("ml", "light"), 0)
    demand.observe([_counted("crit", 0, 0), _counted("light", 0, 0)])
    now[0] += 100 * MS
    demand.observe([_counted("crit", 1 * MS, 1 * MS), _counted("light", 1 * MS, 0)])
    now[0] += 300 * MS  # a first window: 82 % used, 15 % waited; 5 % used, 3 % waited
    seen = demand.observe([_counted("crit", 247 * MS, 46 * MS), _counted("light", 16 * MS, 9 * MS)])
    assert seen.usage == {crit: 8200, light: 500}
    assert seen.held == {crit} and seen.unhindered_usage == {light: 500}
    bursting = DeviceInfo(0, "GPU-0", 0, 0, 3000, 0, compute_soft_limit=10000)
    records = [
        _pod("crit", ("GPU-0", 9000)),
        PodRecord("ml", "burst", Path("/none/burst"), devices=(bursting,)),
    ]
    wanting = Demand(wanting={crit, (("ml", "burst"), 0)}, usage={crit: 8200}, held={crit})
    effective = {("ml", "crit"): {0: 9000}, ("ml", "burst"): {0: 800}}
    assert node_burst_rates(records, effective, wanting) == {("ml", "burst"): {0: 0}}
    unheld = Demand(wanting={crit, (("ml", "burst"), 0)}, usage={crit: 8200})
    assert node_burst_rates(records, effective, unheld) == {("ml", "burst"): {0: 1300}}
    # Once it wants the GPU no more, its rate is written as none: before, none was written,
    # and the last rate, counted without pods that woke since, was run at for up to 5 s.
    idle = Demand(wanting={crit}, usage={crit: 8200})
    assert node_burst_rates(records, effective, idle) == {("ml", "burst"): {0: 0}}


@pytest.mark.parametrize(
    ("pods", "wanted"),
    [
        # A training pod (hard 50, soft 100) beside one that uses 17 %: 100 - 22 = 78.
        ({"train": (5000, 10000, 9000), "infer": (5000, 0, 1700)}, {"train": 7800}),
        # The other uses its whole limit: nothing left above 50.
        ({"train": (5000, 10000, 5000), "infer": (5000, 0, 4900)}, {"train": 0}),
        # Not yet measured: counted at its whole limit, of the 98 % a GPU pods take turns on gives.
        ({"train": (3000, 10000, None), "new": (4000, 0, None)}, {"train": 5800}),
        # Two busy bursting pods share what is left by their room: 38 left (c is held at its
        # limit), rooms 50 and 30.
        (
            {"a": (2000, 7000, None), "b": (2000, 5000, None), "c": (2000, 0, 1800)},
            {"a": 4375, "b": 3425},
        ),
        # A bursting pod is counted at what it needs too: beside one that uses 20 % (its
        # burst unused) the training pod takes the rest, 100 - 25. Before, each bursting pod
        # was counted at its hard limit: 50, with the GPU a third idle.
        ({"train": (5000, 10000, None), "infer": (5000, 10000, 2000)}, {"train": 7500, "infer": 0}),
        # Two light bursting pods: what neither needs is still shared by room, as a ceiling.
        (
            {"a": (2000, 7000, 0), "b": (2000, 5000, 0), "c": (2000, 0, 1800)},
            {"a": 6250, "b": 4550},
        ),
        # A light bursting pod needs less than its hard limit: a busy one takes the rest.
        ({"a": (3000, 10000, 500), "b": (3000, 10000, None)}, {"a": 0, "b": 9000}),
        # Never past the soft limit: the rest stays.
        ({"a": (2000, 3000, 0), "c": (1000, 0, 0)}, {"a": 3000}),
        # Alone: no rate. Nothing the others leave was measured; the limiter bursts while it
        # sees no other pod and holds the hard limit beside one that wakes until a pass
        # weighs it in.
        ({"a": (2000, 10000, 0)}, {"a": 0}),
    ],
)
def test_a_bursting_pod_takes_what_the_others_leave(
    pods: dict[str, tuple[int, int, int | None]], wanted: dict[str, int]
) -> None:
    assert burst_rates(pods) == wanted


def test_a_bursting_pod_gets_no_more_than_the_others_leave_of_a_divided_gpu() -> None:
    """Limits of 50 and 50 (burst 100) ask for all of a GPU the two take turns on: each is held
    to 49 and, while the other uses all of its 49, the bursting pod gets none above it (from
    100 % it was given the 2 % kept back for hand-overs: 51 beside the other's 49). Beside a pod
    that uses 17 % it takes the rest of the GPU, 100 - 49 - 22."""
    effective = effective_limits({"train": (5000, 2), "infer": (5000, 2)})
    assert effective == {"train": 4900, "infer": 4900}
    pods = {"train": (effective["train"], 10000, 4900), "infer": (effective["infer"], 0, 4900)}
    assert burst_rates(pods) == {"train": 0}
    pods["infer"] = (effective["infer"], 0, 1700)
    assert burst_rates(pods) == {"train": 7800}


def _busy(daemon: Daemon, workloads: list["subprocess.Popen[str]"], *names: str) -> None:
    """A workload in each pod, launching until the test ends: the pods want the GPU."""
    for name in names:
        workloads.append(daemon.workload(name, "--duration", "60", "--kernel-us", "500"))


def test_the_daemon_publishes_effective_limits(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"]
) -> None:
    for name, qos in (("hi", "high"), ("lo", "low")):
        created = daemon.cli("pods", "create", name, "--compute", "0=60", "--qos", qos, "--json")
        assert created.returncode == 0, created.stderr
    _busy(daemon, workloads, "hi", "lo")
    regions = {name: open_region(daemon.base / "default" / name / "shm") for name in ("hi", "lo")}
    try:
        wait_for(lambda: regions["lo"].effective(0) == 3800, timeout=10)
        assert regions["hi"].effective(0) == 6000
        # Weights change live: equal weights give 49/49 (of the 98 % a shared GPU gives).
        assert daemon.cli("pods", "update", "lo", "--weight", "4").returncode == 0
        wait_for(lambda: regions["lo"].effective(0) == 4900, timeout=10)
        assert regions["hi"].effective(0) == 4900
        pod = daemon.http.get("/api/v1/pods/default/lo").json()
        assert (pod["qos"], pod["weight"]) == ("low", 4)
    finally:
        for region in regions.values():
            region.close()
    bad = daemon.cli("pods", "update", "lo", "--qos", "urgent")
    assert bad.returncode == 2
    assert "--qos 'urgent': expected low, medium, high or critical" in bad.stderr


def test_a_weight_a_tenant_writes_into_its_region_takes_nothing_from_others(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"]
) -> None:
    """The region is the tenant's to write; the class and weight are the daemon's: one written
    there is set back and never weighs in the division of an oversubscribed GPU."""
    for name in ("honest", "greedy"):
        created = daemon.cli("pods", "create", name, "--compute", "0=60", "--qos", "low")
        assert created.returncode == 0, created.stderr
    _busy(daemon, workloads, "honest", "greedy")
    regions = {n: open_region(daemon.base / "default" / n / "shm") for n in ("honest", "greedy")}
    try:
        wait_for(lambda: regions["greedy"].effective(0) == 4900, timeout=10)
        regions["greedy"].set_policy(3, 1_000_000)  # critical, and the largest weight
        wait_for(lambda: (regions["greedy"].qos, regions["greedy"].weight) == (0, 0), timeout=10)
        time.sleep(1.5)  # a few passes
        assert regions["greedy"].effective(0) == regions["honest"].effective(0) == 4900
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
        assert regions["greedy"].effective(0) == regions["honest"].effective(0) == 4900
        # The admin's change through the API still holds.
        assert daemon.cli("pods", "update", "greedy", "--weight", "3").returncode == 0
        wait_for(lambda: regions["honest"].effective(0) == 3800, timeout=10)
        assert regions["greedy"].effective(0) == 6000
    finally:
        for region in regions.values():
            region.close()


def _share(process: "subprocess.Popen[str]") -> float:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return float(100 * json.loads(out)["achieved_kernels_per_s"] * 500 / 1e6)


@pytest.mark.parametrize("sleeper", [False, True], ids=["no process", "a process asleep"])
def test_an_idle_pod_takes_nothing_and_one_that_wakes_regains_its_share(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"], sleeper: bool
) -> None:
    """Before, a pod with a 50 % limit and no process cut a busy 30/70 pair to 20/47 on the
    simulated GPU (20.7 / 48.4 on an H100). Nor does a pod whose process allocated memory and
    sleeps with its context open (a notebook between cells) take anything."""
    for name, compute in (("a", 30), ("b", 70), ("idle", 50)):
        created = daemon.cli("pods", "create", name, "--compute", f"0={compute}")
        assert created.returncode == 0, created.stderr
    if sleeper:
        asleep = daemon.workload("idle", "--alloc", "64M", "--kernels", "0", "--hold", "60")
        workloads.append(asleep)
    regions = {n: open_region(daemon.base / "default" / n / "shm") for n in ("a", "b", "idle")}
    try:
        if sleeper:
            wait_for(lambda: regions["idle"].devices[0].memory_used > 0, timeout=10)
        pair = [daemon.workload(n, "--duration", "4", "--kernel-us", "500") for n in ("a", "b")]
        workloads.extend(pair)
        wait_for(lambda: regions["a"].devices[0].gpu_ns > 0, timeout=10)
        time.sleep(1.5)  # passes with the pair launching
        # 98 % (what a GPU pods take turns on gives) in proportion to 30 and 70.
        assert [regions[n].effective(0) for n in ("a", "b", "idle")] == [2940, 6860, 0]
        low, high = (_share(process) for process in pair)
        assert low == pytest.approx(30, abs=4) and high == pytest.approx(70, abs=4)
        # The idle pod wakes: within a pass or two all three are weighed (150 % of limits).
        _busy(daemon, workloads, "a", "b", "idle")
        weighed = [1960, 4573, 3266]  # 98 % in proportion to 30, 70 and 50
        wait_for(lambda: [regions[n].effective(0) for n in ("a", "b", "idle")] == weighed)
    finally:
        for region in regions.values():
            region.close()


def test_a_pod_that_uses_little_takes_only_that_from_a_busy_pair(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"]
) -> None:
    """A 50 % pod running short rounds (2 ms of work in 42 ms: about 5 %) beside a busy 30/70
    pair: the daemon divided the GPU by its whole limit, the pair got 20 / 47 and the GPU sat
    30 % idle. Now it keeps its own limit and the pair shares the rest."""
    for name, compute in (("a", 30), ("b", 70), ("light", 50)):
        created = daemon.cli("pods", "create", name, "--compute", f"0={compute}")
        assert created.returncode == 0, created.stderr
    light = daemon.workload(
        "light", "--duration", "12", "--kernel-us", "500", "--batch", "4", "--idle-ms", "40"
    )
    workloads.append(light)
    regions = {n: open_region(daemon.base / "default" / n / "shm") for n in ("a", "b", "light")}
    try:
        wait_for(lambda: regions["light"].devices[0].gpu_ns > 0, timeout=10)
        pair = [daemon.workload(n, "--duration", "6", "--kernel-us", "500") for n in ("a", "b")]
        workloads.extend(pair)
        # Weighed: the pair's effective limits add up to what the GPU gives less what the light
        # pod uses (about 5), the light pod keeps its 50.
        wait_for(
            lambda: (
                regions["light"].effective(0) == 5000
                and 8800 <= regions["a"].effective(0) + regions["b"].effective(0) <= 9500
            ),
            timeout=15,
        )
        shown = json.loads(daemon.cli("pods", "get", "a", "--json").stdout)
        assert 0 < shown["gpus"][0]["compute_effective"] < 30  # what the daemon holds it to
        low, high = (_share(process) for process in pair)
        print(f"beside a light pod: {low:.1f} / {high:.1f}")
        assert low >= 25 and high >= 58  # 20 / 47 before
    finally:
        for region in regions.values():
            region.close()


@pytest.mark.parametrize("infer_flags", [(), ("--burst", "0=100")], ids=["plain", "bursting"])
def test_a_training_pod_takes_what_a_bursty_pod_leaves_and_the_bursty_pod_waits_little(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"], infer_flags: tuple[str, ...]
) -> None:
    """Before, a training pod (hard 50, burst 100) fell to 50 % whenever a bursty pod beside it
    (10 ms of work, then 40 ms idle: about 20 %) wanted the GPU at all; and each of the bursty
    pod's rounds waited for the rest of the training pod's epoch (p50/p99 14.8/44.9 ms against
    10.2 alone). Now the training pod yields to it at once, with a short backlog. With a burst
    of its own, the bursty pod was counted at its whole hard limit: the training pod was held
    to 50 % (a rate of 0 in every pass)."""
    for name, flags in (
        ("train", ["--compute", "0=50", "--burst", "0=100"]),
        ("infer", ["--compute", "0=50", *infer_flags]),
    ):
        created = daemon.cli("pods", "create", name, *flags)
        assert created.returncode == 0, created.stderr
    rounds = ("--kernel-us", "1000", "--batch", "10", "--idle-ms", "40")
    alone_run = daemon.workload("infer", "--duration", "2", *rounds)
    workloads.append(alone_run)
    alone = json.loads(alone_run.communicate(timeout=60)[0])
    infer = daemon.workload("infer", "--duration", "6", *rounds)
    train = daemon.workload("train", "--duration", "6", "--kernel-us", "500")
    workloads.extend([infer, train])
    with open_region(daemon.base / "default" / "train" / "shm") as region:
        wait_for(lambda: region.burst(0) > 5000, timeout=10)  # the daemon saw both at work
    trained = _share(train)
    out, err = infer.communicate(timeout=60)
    assert infer.returncode == 0, err
    report = json.loads(out)
    print(
        f"train {trained:.1f} %, infer rounds p50/p90/p99 {report['round_ms_p50']}/"
        f"{report['round_ms_p90']}/{report['round_ms_p99']} ms, alone "
        f"{alone['round_ms_p50']}/{alone['round_ms_p90']}/{alone['round_ms_p99']} ms"
    )
    assert trained >= 65  # 75 on an idle machine; 50 before
    # The bursty pod's work still gets done: at least 17 of its 20 rounds a second.
    assert report["rounds"] >= 17 * 6
    # Nine rounds in ten wait about a drain of the training pod's short backlog (2 ms), far
    # less than the rest of its 32-ms epoch (a margin for a loaded machine).
    assert report["round_ms_p90"] <= alone["round_ms_p90"] + 8


def test_a_class_written_while_the_daemon_was_down_is_set_back(daemon: Daemon) -> None:
    """Before, the class and weight the daemon held lived in its memory: a tenant that wrote
    critical and the largest weight into its region while the daemon was down had them adopted
    by the next daemon, and took contended time from the other pods."""
    created = daemon.cli("pods", "create", "tenant", "--compute", "0=60", "--qos", "low")
    assert created.returncode == 0, created.stderr
    path = daemon.base / "default" / "tenant" / "shm"
    time.sleep(1.5)  # a pass or two
    assert daemon.stop() == 0
    with open_region(path) as region:
        region.set_policy(3, 1_000_000)
    daemon.start()
    with open_region(path) as region:
        wait_for(lambda: (region.qos, region.weight) == (Qos.LOW, 0), timeout=10)
    book = daemon.base / ".daemon"
    assert book.stat().st_mode & 0o777 == 0o700
    assert json.loads((book / "policies.json").read_text())[0]["qos"] == Qos.LOW


@pytest.mark.parametrize(
    "document",
    [None, {"not": "a list"}, [{"namespace": "a"}], [{"namespace": "a", "name": "b",
     "region": [1, 2], "qos": "high", "weight": 0}], [1, 2]],
)  # fmt: skip
def test_a_policy_book_of_the_wrong_shape_is_no_policy(document: object) -> None:
    assert _decode_policies(document) == {}


def test_a_policy_book_round_trips() -> None:
    policies = {("ml", "a"): ((5, 7), Qos.HIGH, 3), ("ml", "b"): ((5, 9), Qos.LOW, 0)}
    assert _decode_policies(_encode_policies(policies)) == policies


def test_a_bursting_pod_gives_way_at_once_to_a_pod_that_wakes(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"]
) -> None:
    """A pod at 30 (burst 100) runs alone, then a 70 % pod starts beside it. Before, the daemon
    published the lone pod's soft limit as its burst rate, which it kept beside the newcomer:
    the 70 % pod got 43-50 % of its first two seconds and 55-58 % of the next three: its use,
    measured over passes that held its idle time or the other's burst, gained 5 points a
    pass."""
    for name, flags in (("a", ["--burst", "0=100"]), ("b", [])):
        limit = "0=30" if name == "a" else "0=70"
        created = daemon.cli("pods", "create", name, "--compute", limit, *flags)
        assert created.returncode == 0, created.stderr
    workloads.append(daemon.workload("a", "--duration", "60", "--kernel-us", "500"))
    with open_region(daemon.base / "default" / "a" / "shm") as region:
        wait_for(lambda: region.devices[0].gpu_ns > 0, timeout=10)
        time.sleep(1.5)  # passes with a alone, bursting
        # Alone: no rate (what others leave was not measured), so at the first launch of
        # another pod that waits its hard limit holds.
        assert region.burst(0) == 0
        woken = daemon.workload("b", "--duration", "3", "--kernel-us", "500", "--marks")
        workloads.append(woken)
        out, err = woken.communicate(timeout=60)
        assert woken.returncode == 0, err
        # Weighed beside the newcomer at its whole limit until its use was measured, then at
        # what it used: nothing left above the hard limit.
        assert region.burst(0) == 0
    marks = json.loads(out)["marks"]
    share = share_between(marks, 0.5, 2.5)
    assert share >= 60, share  # 70 on an idle machine; about 50 before


def test_a_pod_that_wakes_beside_a_bursting_pod_with_a_rate_gets_its_share_at_once(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"]
) -> None:
    """A pod at 30 (burst 100) runs beside a light one (10 %, using a few points): the daemon
    publishes it a burst rate of about 90. Then a 70 % pod wakes. Before, the bursting pod kept
    that rate, counted without the newcomer, until the daemon's next pass: the 70 % pod got
    16-28 % of each of its first three quarter seconds. Now the arbiter tells the bursting pod
    that a pod woke (it runs at its hard limit), and the daemon makes a pass 0.1 s later."""
    for name, limit, flags in (("a", "0=30", ["--burst", "0=100"]), ("b", "0=70", []),
                               ("light", "0=10", [])):  # fmt: skip
        created = daemon.cli("pods", "create", name, "--compute", limit, *flags)
        assert created.returncode == 0, created.stderr
    workloads.append(daemon.workload("a", "--duration", "60", "--kernel-us", "500"))
    workloads.append(
        daemon.workload(
            "light", "--duration", "60", "--kernel-us", "500", "--batch", "2", "--idle-ms", "40"
        )
    )
    with open_region(daemon.base / "default" / "a" / "shm") as region:
        wait_for(lambda: region.burst(0) > 8000, timeout=20)  # counted beside the light pod
        woken = daemon.workload("b", "--duration", "2", "--kernel-us", "500", "--marks")
        workloads.append(woken)
        out, err = woken.communicate(timeout=60)
        assert woken.returncode == 0, err
    marks = json.loads(out)["marks"]
    share = share_between(marks, 0.0, 0.75)
    print(f"the woken pod's first 0.75 s: {share:.1f} %")
    assert share >= 45, share  # 60-65 on an idle machine; 23 before


def test_a_stopped_process_takes_nothing_from_a_pod_that_runs(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"]
) -> None:
    """A process stopped by SIGSTOP (a debugger, a stopped job) may be caught holding the
    device lease or waiting for it: the daemon's arbiter takes the lease back once its queued
    work should have drained, and its pod stops wanting the GPU, so the other pod runs on at its
    own limit."""
    for name, compute in (("runs", 70), ("stops", 30)):
        created = daemon.cli("pods", "create", name, "--compute", f"0={compute}")
        assert created.returncode == 0, created.stderr
    started = time.monotonic()
    runner = daemon.workload("runs", "--duration", "5", "--kernel-us", "500", "--marks")
    stopped = daemon.workload("stops", "--duration", "60", "--kernel-us", "500")
    workloads.extend([runner, stopped])
    with open_region(daemon.base / "default" / "stops" / "shm") as region:
        wait_for(lambda: region.devices[0].gpu_ns > 0, timeout=10)
    time.sleep(0.5)
    stopped.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic() - started
    try:
        out, err = runner.communicate(timeout=60)
    finally:
        stopped.send_signal(signal.SIGKILL)
        stopped.send_signal(signal.SIGCONT)
    assert runner.returncode == 0, err
    marks = json.loads(out)["marks"]
    share = share_between(marks, stopped_at + 0.5, min(stopped_at + 2.5, 4.8))
    print(f"the running pod got {share:.1f} % after the other stopped")
    assert share >= 60, share  # 70 on an idle machine
