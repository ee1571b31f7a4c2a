"""The placement rule of GetPreferredAllocation and the per-GPU ledger Allocate charges."""

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu_common.limits import WHOLE_GPU
from vgpu_hypervisor.daemon.cluster import Charge
from vgpu_hypervisor.device_plugin.accounting import (
    ANY_POD,
    FOLDER,
    DoesNotFit,
    Ledger,
    largest,
    place,
    place_unknown,
)
from vgpu_hypervisor.device_plugin.resources import Gpu, gpu_of

GiB = 1 << 30
UUIDS = [f"GPU-{n:08x}-0000-4000-8000-000000000000" for n in range(6)]

charges = st.builds(Charge, st.integers(0, 80), st.integers(0, WHOLE_GPU))


@st.composite
def situations(draw: st.DrawFn) -> tuple[dict[str, Charge], dict[str, Charge], list[str], int]:
    """A node of 1 to 6 GPUs: what each has left, what the pod asks on each, the free
    shares the kubelet offers (any of each GPU's 4), and how many GPUs the pod asks for."""
    gpus = UUIDS[: draw(st.integers(1, len(UUIDS)))]
    free = {uuid: draw(charges) for uuid in gpus}
    asks = {uuid: draw(charges) for uuid in gpus}
    shares = [f"{uuid}-{k}" for uuid in gpus for k in range(4)]
    available = draw(st.lists(st.sampled_from(shares), unique=True))
    return free, asks, available, draw(st.integers(1, 4))


def fits(free: dict[str, Charge], asks: dict[str, Charge], uuid: str) -> bool:
    return free[uuid].holds(asks[uuid])


@settings(max_examples=400, deadline=None)
@given(situations(), st.sampled_from(["binpack", "spread"]))
def test_a_placement_is_distinct_gpus_that_hold_the_pod_and_is_found_when_one_exists(
    situation: tuple[dict[str, Charge], dict[str, Charge], list[str], int], policy: str
) -> None:
    free, asks, available, size = situation
    chosen = place(free, asks, available, (), size=size, policy=policy)  # type: ignore[arg-type]
    offered = {gpu_of(one) for one in available}
    holding = sorted(uuid for uuid in offered if fits(free, asks, uuid))
    if len(holding) < size:
        assert chosen is None
        return
    assert chosen is not None and len(chosen) == size
    gpus = [gpu_of(one) for one in chosen]
    assert len(set(gpus)) == size and set(chosen) <= set(available)
    assert all(fits(free, asks, uuid) for uuid in gpus)
    # Each GPU's lowest-numbered share offered.
    for one in chosen:
        same = [o for o in available if gpu_of(o) == gpu_of(one)]
        assert one == min(same, key=lambda o: int(o.rsplit("-", 1)[1]))

    # Binpack: no GPU left out holds the pod with less left after it; spread: with more.
    def left(uuid: str) -> tuple[int, int]:
        after = free[uuid] - asks[uuid]
        return (after.memory, after.compute)

    for taken, skipped in itertools.product(gpus, set(holding) - set(gpus)):
        if policy == "binpack":
            assert (left(taken), taken) < (left(skipped), skipped)
        else:
            assert (left(taken), skipped) > (left(skipped), taken)


@given(situations())
def test_must_include_devices_are_kept_and_the_rest_is_other_gpus(
    situation: tuple[dict[str, Charge], dict[str, Charge], list[str], int],
) -> None:
    free, asks, available, size = situation
    if not available:
        return
    must = available[:1]
    chosen = place(free, asks, available, must, size=size, policy="binpack")
    others = {gpu_of(o) for o in available} - {gpu_of(must[0])}
    if sum(fits(free, asks, uuid) for uuid in others) < size - 1:
        assert chosen is None
        return
    assert chosen is not None and chosen[0] == must[0]
    assert len({gpu_of(one) for one in chosen}) == size


def test_two_shares_of_one_gpu_are_never_a_placement() -> None:
    free = {UUIDS[0]: Charge(80, WHOLE_GPU)}
    shares = [f"{UUIDS[0]}-{k}" for k in range(4)]
    assert place(free, {UUIDS[0]: Charge(1, 1)}, shares, (), size=2, policy="binpack") is None
    assert (
        place(free, {UUIDS[0]: Charge(1, 1)}, shares, shares[:2], size=2, policy="binpack") is None
    )


def test_largest_takes_the_most_of_each_part_on_each_gpu() -> None:
    one = {UUIDS[0]: Charge(4, 1000), UUIDS[1]: Charge(2, 5000)}
    two = {UUIDS[0]: Charge(1, 3000)}
    assert largest([one, two]) == {UUIDS[0]: Charge(4, 3000)}
    assert largest([]) == {}


GPUS = [Gpu(UUIDS[0], 80 * GiB), Gpu(UUIDS[1], 40 * GiB)]


def test_the_ledger_refuses_what_a_gpu_cannot_hold_saying_why(tmp_path: Path) -> None:
    ledger = Ledger(GPUS, tmp_path / FOLDER)
    assert ledger.charge("a", "ml/a", {UUIDS[1]: Charge(30 * GiB, 5000)}) == (UUIDS[1],)
    assert ledger.charge("a", "ml/a", {UUIDS[1]: Charge(30 * GiB, 5000)}) == ()  # once per GPU
    with pytest.raises(DoesNotFit) as refused:
        ledger.charge("b", "ml/b", {UUIDS[0]: Charge(GiB, 100), UUIDS[1]: Charge(16 * GiB, 100)})
    assert str(refused.value) == (
        f"pod ml/b: GPU {UUIDS[1]} cannot hold it: it asks 16 GiB and 1 % there, and 30 GiB "
        "and 50 % of the GPU's 40 GiB and 100 % are committed to 1 other pod(s)"
    )
    assert ledger.charged("b") == {}  # all or none
    with pytest.raises(DoesNotFit, match="it asks 10 GiB and 60 % there"):
        ledger.charge("c", "ml/c", {UUIDS[1]: Charge(10 * GiB, 6000)})  # compute does not fit
    assert ledger.charge("c", "ml/c", {UUIDS[1]: Charge(10 * GiB, 5000)}) == (UUIDS[1],)
    assert ledger.committed() == {UUIDS[0]: Charge(0, 0), UUIDS[1]: Charge(40 * GiB, WHOLE_GPU)}
    assert ledger.free()[UUIDS[1]] == Charge(0, 0)


def test_the_ledger_outlives_a_restart_and_releases_pods_gone(tmp_path: Path) -> None:
    live: set[str] | None = None
    ledger = Ledger(GPUS, tmp_path / FOLDER, lambda: live)
    ledger.charge("a", "ml/a", {UUIDS[0]: Charge(8 * GiB, 2000)})
    ledger.charge("b", "ml/b", {UUIDS[0]: Charge(4 * GiB, 1000), UUIDS[1]: Charge(GiB, 100)})
    again = Ledger(GPUS, tmp_path / FOLDER, lambda: live)
    assert again.committed()[UUIDS[0]] == Charge(12 * GiB, 3000)  # not known yet: all kept
    live = {"b"}
    assert again.committed() == {UUIDS[0]: Charge(4 * GiB, 1000), UUIDS[1]: Charge(GiB, 100)}
    assert Ledger(GPUS, tmp_path / FOLDER).charged("a") == {}  # its release was written


@settings(max_examples=400, deadline=None)
@given(situations(), st.integers(0, 2))
def test_a_placement_from_the_devices_alone_keeps_to_the_kubelets_request(
    situation: tuple[dict[str, Charge], dict[str, Charge], list[str], int],
    reused: int,
) -> None:
    """No pod known (place_unknown): the devices it must include, then one share on each of
    other GPUs with room left, those with the most first; None only when no such answer of
    the request's size exists."""
    free, _, available, size = situation
    must = available[:reused]
    chosen = place_unknown(free, available, must, size=size)
    others = {gpu_of(one) for one in available} - {gpu_of(one) for one in must}
    room = [uuid for uuid in others if free[uuid].holds(ANY_POD)]
    distinct = len({gpu_of(one) for one in must}) == len(must)
    if not distinct or len(must) > size or len(room) < size - len(must):
        assert chosen is None
        return
    assert chosen is not None and len(chosen) == size
    assert set(chosen) <= set(available) and chosen[: len(must)] == sorted(must)
    assert len({gpu_of(one) for one in chosen}) == size
    assert all(free[gpu_of(one)].holds(ANY_POD) for one in chosen[len(must) :])
    # The most room first: no GPU left out has more of it.
    taken = [free[gpu_of(one)] for one in chosen[len(must) :]]
    left_out = [free[uuid] for uuid in room if uuid not in {gpu_of(one) for one in chosen}]
    if taken and left_out:
        least = min((c.memory, c.compute) for c in taken)
        assert all((c.memory, c.compute) <= least for c in left_out)
