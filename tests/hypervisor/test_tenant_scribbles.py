"""Words a tenant writes into its own region (it can: the file is its pod's) against the daemon's
passes: none stops a pass, and none lets the pod out of what the daemon holds it to."""

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from vgpu_common.limits import MAX_WEIGHT, GpuLimits, Qos
from vgpu_hypervisor.daemon.log_format import TextFormatter
from vgpu_hypervisor.daemon.node import Node
from vgpu_hypervisor.daemon.pods import PodNotFound, PodRecord, PodStore
from vgpu_limiter import region as regions
from vgpu_limiter.region import FLAG_DELETED, FLAG_FROZEN, DeviceLimits, ProcessInfo, open_region

from tests.hypervisor.test_boost import SIM_GPU0
from tests.limiter.test_region import claim, raw

GiB = 1 << 30
FROZEN_MARK = regions.CONSTANTS["VGPU_SCHED_FROZEN"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PodStore]:
    store = PodStore(tmp_path / "base")
    try:
        yield store
    finally:
        store.close()


def _node(store: PodStore) -> Node:
    """The daemon's passes over the regions (no GPU sampled: the regions are what is read)."""
    return Node(None, store)  # type: ignore[arg-type]


def _start_ticks() -> int:
    """This process's start time as a region slot holds it (/proc/self/stat field 22)."""
    stat = Path("/proc/self/stat").read_text()
    return int(stat.rpartition(")")[2].split()[19])


def _live_worker(path: Path) -> None:
    """A slot of a live process (this one) in the region: the pod's file stays while it lives."""
    with raw(path) as pointer:
        claim(
            pointer,
            0,
            os.getpid(),
            [0],
            namespace=regions.own_pid_namespace(),
            start=_start_ticks(),
        )


def test_a_freeze_a_tenant_marks_on_an_entry_it_named_stops_no_pass(store: PodStore) -> None:
    """A tenant froze its own pod on an entry whose UUID it wrote as no UUID at all; the daemon
    adopted that freeze (as an earlier daemon's), and once the tenant cleared it, made it again
    by that name: ValueError (bad GPU UUID) out of every pass, for good (the freeze is kept in
    freezes.json), so no freeze of any pod was renewed, no dead worker's memory given back,
    and every change through the API answered 500."""
    store.create("default", "tenant", {SIM_GPU0: GpuLimits(compute=3000)})
    store.create("default", "victim", {SIM_GPU0: GpuLimits(compute=3000)})
    store.freeze("default", "victim")
    node = _node(store)
    node.refresh()
    path = regions.region_path(store.base, "default", "tenant")
    with raw(path) as pointer:
        pointer.devices[0].uuid = b"not a GPU"
        pointer.devices[0].scheduler_state[FROZEN_MARK] = 1
        pointer.freeze_until_ns = time.monotonic_ns() + 3600 * 10**9
        pointer.flags |= FLAG_FROZEN
    node.refresh()
    with raw(path) as pointer:
        pointer.flags &= ~FLAG_FROZEN
    with open_region(regions.region_path(store.base, "default", "victim")) as victim:
        before = victim.freeze_until_ns
        time.sleep(0.01)
        node.refresh()
        node.refresh()
        assert victim.freeze_until_ns > before  # the admin's freeze of the other pod holds
    assert [pod.name for pod in node.view.pods] == ["tenant", "victim"]


def test_a_pod_a_tenant_marks_deleted_keeps_what_the_daemon_holds(store: PodStore) -> None:
    """A tenant set the deleted flag in its own region (its worker alive, so the file stayed):
    the pod read as deleted, and the daemon forgot the limits, class and freeze it held for it.
    The tenant then wrote 99.99 %, 64 GiB and critical with the largest weight, cleared the flag
    and its freeze, and the daemon adopted it all as a new pod's: the pod ran unfrozen, over
    its limits, and took contended time from the pods beside it."""
    store.create("default", "tenant", {SIM_GPU0: GpuLimits(memory=2 * GiB, compute=3000)})
    path = regions.region_path(store.base, "default", "tenant")
    _live_worker(path)
    node = _node(store)
    node.refresh()
    store.freeze("default", "tenant")
    node.refresh()
    with raw(path) as pointer:
        pointer.flags |= FLAG_DELETED
    node.refresh()
    node.refresh()
    with open_region(path) as region:
        region.set_limits(SIM_GPU0, 64 * GiB, 9999)
        region.set_policy(int(Qos.CRITICAL), MAX_WEIGHT)
        region.resume()
        region.change_flags(clear=FLAG_DELETED)
        node.refresh()
        assert region.devices[0].limits == DeviceLimits(2 * GiB, 3000, 0, 0)
        assert (region.qos, region.weight) == (int(Qos.MEDIUM), 0)
        assert region.frozen
    node.refresh()  # the view of a pass that read the words set back
    pod = node.view.pod("default", "tenant")
    assert pod is not None and pod.frozen and pod.gpus[0].compute_limit == 30


def test_a_pod_deleted_while_its_worker_runs_stays_deleted_when_its_tenant_clears_the_mark(
    store: PodStore,
) -> None:
    """The admin deleted a pod whose worker still ran: the daemon forgot what it held for it
    and marked its file deleted. Its tenant cleared the mark with 99.99 % and the critical
    class written: the pod came back, its words adopted as a new pod's, and weighed beside
    the others on a pod the admin had deleted."""
    store.create("default", "tenant", {SIM_GPU0: GpuLimits(memory=2 * GiB, compute=3000)})
    path = regions.region_path(store.base, "default", "tenant")
    _live_worker(path)
    node = _node(store)
    node.refresh()
    store.delete("default", "tenant", force=True)
    with open_region(path) as region:
        region.set_limits(SIM_GPU0, 64 * GiB, 9999)
        region.set_policy(int(Qos.CRITICAL), MAX_WEIGHT)
        region.change_flags(clear=FLAG_DELETED)
        node.refresh()
        assert region.flags & FLAG_DELETED
    assert node.view.pod("default", "tenant") is None
    with pytest.raises(PodNotFound):
        store.get("default", "tenant")
    store.create("default", "tenant", {SIM_GPU0: GpuLimits(memory=2 * GiB, compute=3000)})
    with open_region(path) as region:  # made again by the admin: the mark stays cleared
        node.refresh()
        assert not region.flags & FLAG_DELETED


def test_a_deleted_pod_stays_deleted_when_its_tenant_clears_the_mark_while_no_daemon_runs(
    store: PodStore,
) -> None:
    """The admin deleted a pod whose worker still ran; the daemon stopped (an upgrade), and
    meanwhile the tenant wrote 99.99 % and the critical class and cleared the mark. The next
    daemon, which held the deleted pods in memory alone, adopted the pod with its tenant's
    words as a new pod's."""
    store.create("default", "tenant", {SIM_GPU0: GpuLimits(memory=2 * GiB, compute=3000)})
    path = regions.region_path(store.base, "default", "tenant")
    _live_worker(path)
    _node(store).refresh()
    store.delete("default", "tenant", force=True)
    store.close()  # the daemon stops
    with open_region(path) as region:
        region.set_limits(SIM_GPU0, 64 * GiB, 9999)
        region.set_policy(int(Qos.CRITICAL), MAX_WEIGHT)
        region.change_flags(clear=FLAG_DELETED)
    after = PodStore(store.base)  # the next daemon
    try:
        node = _node(after)
        node.refresh()
        assert node.view.pod("default", "tenant") is None
        with pytest.raises(PodNotFound):
            after.get("default", "tenant")
        with open_region(path) as region:
            assert region.flags & FLAG_DELETED
        after.create("default", "tenant", {SIM_GPU0: GpuLimits(memory=2 * GiB, compute=3000)})
        node.refresh()
        with open_region(path) as region:  # made again by the admin: the mark stays cleared
            assert not region.flags & FLAG_DELETED
            assert region.devices[0].limits == DeviceLimits(2 * GiB, 3000, 0, 0)
    finally:
        after.close()
    third = PodStore(store.base)  # and the daemon after that holds it as the admin made it
    try:
        third.get("default", "tenant")
    finally:
        third.close()


def test_a_region_gone_between_the_scan_and_the_reap_stops_no_pass(
    store: PodStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's region went (a tenant that owns its pod folder, a limiter's pod, renames its
    file away and back, or marks it deleted) after the pass's scan read it and before the pass
    read it again for the slots it had reclaimed (a slot of a dead process, which the tenant
    can write every time): PodNotFound out of the pass, for every pod, and a 500 for the API
    change whose pass it was."""
    store.create("default", "tenant", {SIM_GPU0: GpuLimits(compute=3000)})
    store.create("default", "victim", {SIM_GPU0: GpuLimits(compute=3000)})
    path = regions.region_path(store.base, "default", "tenant")
    with raw(path) as pointer:
        claim(pointer, 0, 0x7FFFFFF0, [0], namespace=regions.own_pid_namespace(), start=1)
    reap = store.reap

    def reap_and_rename(record: PodRecord) -> list[ProcessInfo]:
        reaped = reap(record)
        if record.path == path:  # the tenant's rename lands right then
            path.rename(path.with_name("away"))
        return reaped

    monkeypatch.setattr(store, "reap", reap_and_rename)
    node = _node(store)
    node.refresh()
    assert node.view.pod("default", "victim") is not None
    path.with_name("away").rename(path)
    node.refresh()
    assert [pod.name for pod in node.view.pods] == ["tenant", "victim"]


def test_a_uuid_with_a_newline_writes_no_log_line_of_its_own(
    store: PodStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon logs a region's UUID where it names an entry it did not make (the log's
    default form is text, one record a line): a UUID written with a newline and a line after it
    put a line of the tenant's making in the log, here one about another pod."""
    store.create("default", "tenant", {SIM_GPU0: GpuLimits(compute=3000)})
    node = _node(store)
    node.refresh()
    forged = "ERROR vgpu_hypervisor: pod default/victim: x"  # what 48 bytes hold
    with raw(regions.region_path(store.base, "default", "tenant")) as pointer:
        pointer.devices[1].uuid = f"x\n{forged}".encode()
        pointer.device_count = 2
    node.refresh()
    said = [record for record in caplog.records if "is not one the daemon made" in record.msg]
    assert len(said) == 1
    text = TextFormatter().format(said[0])
    assert "\n" not in text and "\r" not in text and forged in text


@pytest.mark.parametrize("hidden", ["renamed", "past-the-count"])
def test_an_entry_a_tenant_renames_or_hides_is_put_back_with_its_limits(
    tmp_path: Path, hidden: str
) -> None:
    """A pod's running processes read the entry they found their GPU in for as long as they
    run. Before, a tenant that renamed that entry to another GPU (or lowered the count of
    entries in use past it) and zeroed its limits ran unlimited: the daemon passed the entry
    over as not the pod's, and set nothing back. Where the entry was is kept across restarts."""
    base = tmp_path / "base"
    path = regions.region_path(base, "default", "tenant")
    for daemon in ("first", "restarted"):
        store = PodStore(base)
        try:
            if daemon == "first":
                store.create(
                    "default", "tenant", {SIM_GPU0: GpuLimits(memory=2 * GiB, compute=3000)}
                )
            node = _node(store)
            node.refresh()
            with raw(path) as pointer:
                if hidden == "renamed":
                    pointer.devices[0].uuid = b"GPU-00000000-0000-0000-0000-0000000000ff"
                else:
                    pointer.device_count = 0
                pointer.devices[0].memory_limit = 0
                pointer.devices[0].compute_limit = 0
            node.refresh()
            with open_region(path) as region:
                (device,) = region.devices
                assert device.uuid.lower() == SIM_GPU0.lower(), daemon
                assert device.limits == DeviceLimits(2 * GiB, 3000, 0, 0), daemon
            node.refresh()
            pod = node.view.pod("default", "tenant")
            assert pod is not None and pod.gpus[0].compute_limit == 30
        finally:
            store.close()
