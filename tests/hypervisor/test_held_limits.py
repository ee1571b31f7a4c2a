"""The limits the daemon holds for a pod, not the words its tenant writes into its region:
what the daemon weighs, shows and sets back (daemon/held_limits.py)."""

import json
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.daemon.held_limits import HeldLimits, _decode, _encode, raises
from vgpu_hypervisor.daemon.pods import PodError, PodStore
from vgpu_limiter import region as regions
from vgpu_limiter.region import COMPUTE_UNLIMITED, DEVICE_OVERSUBSCRIBE, DeviceLimits, open_region

from tests.hypervisor.conftest import Daemon, wait_for
from tests.hypervisor.test_boost import SIM_GPU0
from tests.hypervisor.test_scheduler_weights import _busy

GiB = 1 << 30
HELD = DeviceLimits(4 * GiB, 4000, 0, 0)


@pytest.mark.parametrize(
    ("words", "raised"),
    [
        (HELD, False),
        (DeviceLimits(2 * GiB, 3000, 0, 0), False),  # lowered: the pod's own choice
        (DeviceLimits(4 * GiB + 1, 4000, 0, 0), True),
        (DeviceLimits(0, 4000, 0, 0), True),  # no memory limit
        (DeviceLimits(4 * GiB, 9999, 0, 0), True),
        (DeviceLimits(4 * GiB, 0, 0, 0), True),  # no compute limit
        (DeviceLimits(4 * GiB, COMPUTE_UNLIMITED, 0, 0), True),
        (DeviceLimits(4 * GiB, 4000, 8000, 0), True),  # a burst
        (DeviceLimits(4 * GiB, 4000, 3000, 0), False),  # a "burst" below the limit: none
        (DeviceLimits(4 * GiB, 4000, 0, DEVICE_OVERSUBSCRIBE), True),
    ],
)
def test_which_words_raise_past_the_held_limits(words: DeviceLimits, raised: bool) -> None:
    assert raises(words, HELD) is raised


def test_under_held_limits_of_none_nothing_raises() -> None:
    """A pod made with no compute limit: one the environment seeds is the pod's to have."""
    none = DeviceLimits(0, 0, 0, DEVICE_OVERSUBSCRIBE)
    assert not raises(DeviceLimits(2 * GiB, 3000, 6000, DEVICE_OVERSUBSCRIBE), none)
    assert not raises(DeviceLimits(0, COMPUTE_UNLIMITED, 0, 0), none)
    burst = DeviceLimits(0, 3000, 6000, 0)
    assert not raises(DeviceLimits(0, 3000, 6000, 0), burst)
    assert raises(DeviceLimits(0, 3000, 7000, 0), burst)


words = st.builds(
    DeviceLimits,
    st.sampled_from([0, 1, GiB, 4 * GiB]),
    st.sampled_from([0, 1, 2500, 5000, 9999, COMPUTE_UNLIMITED]),
    st.sampled_from([0, 2500, 5000, COMPUTE_UNLIMITED]),
    st.sampled_from([0, DEVICE_OVERSUBSCRIBE]),
)


@given(words, words, words)
def test_raising_is_a_preorder(a: DeviceLimits, b: DeviceLimits, c: DeviceLimits) -> None:
    """Words never raise past themselves, and words within what is within the held limits are
    within them: setting back never lets a pod climb in steps."""
    assert not raises(a, a)
    if not raises(a, b) and not raises(b, c):
        assert not raises(a, c)


def test_a_book_round_trips_and_one_of_the_wrong_shape_is_none(tmp_path: Path) -> None:
    book = {("ml", "a"): ((5, 7), {"gpu-0": HELD}), ("ml", "b"): ((5, 9), {})}
    entries = {("ml", "a"): {"gpu-0": 3}, ("ml", "b"): {}}
    assert _decode(_encode(book, entries), tmp_path) == (book, entries)
    # A book of a daemon before entries were kept: the limits, no entries known.
    older = [{"namespace": "ml", "name": "a", "region": [5, 7], "gpus": {"gpu-0": [1, 2, 3, 0]}}]
    assert _decode(older, tmp_path)[1] == {("ml", "a"): {}}
    for document in (
        {"not": "a list"},
        [{"namespace": "a"}],
        [{"namespace": "a", "name": "b", "region": [1, 2], "gpus": {"g": [1, 2, 3]}}],
        [{"namespace": "a", "name": "b", "region": [1, 2], "gpus": {"g": [1, -2, 3, 0]}}],
        [{"namespace": "a", "name": "b", "region": [1, 2], "gpus": {"g": [1, True, 3, 0]}}],
        [{"namespace": "a", "name": "b", "region": [1, 2], "gpus": {}, "entries": {"g": "x"}}],
    ):
        assert _decode(document, tmp_path) == ({}, {})


def test_a_new_gpu_is_adopted_and_a_region_made_anew_is_another_pods(tmp_path: Path) -> None:
    from vgpu_limiter.region import DeviceInfo

    held = HeldLimits(tmp_path / ".daemon")
    key = ("ns", "pod")
    device = DeviceInfo(0, "GPU-A", 4 * GiB, 0, 4000, 0)
    held.wrote(key, (1, 2), {"GPU-A": HELD})
    raised = DeviceInfo(0, "GPU-A", 8 * GiB, 0, 4000, 0)
    assert held.bound(key, (1, 2), [raised]) == {"gpu-a": HELD}
    assert held.bound(key, (1, 2), [device]) == {}
    other = DeviceInfo(1, "GPU-B", 0, 0, 0, 0)
    assert held.bound(key, (1, 2), [device, other]) == {}  # adopted: the limiter's seed
    assert held.bound(key, (1, 3), [raised]) == {}  # another file: its words are adopted
    again = HeldLimits(tmp_path / ".daemon")  # kept across restarts
    assert again.bound(key, (1, 3), [device]) == {}
    assert again.bound(key, (1, 3), [DeviceInfo(0, "GPU-A", 9 * GiB, 0, 4000, 0)]) == {
        "gpu-a": DeviceLimits(8 * GiB, 4000, 0, 0)
    }


def test_an_admins_change_writes_no_raise_its_tenant_keeps_in_the_region(tmp_path: Path) -> None:
    """Before, an admin's change of one limit kept the others as the region had them: a tenant
    that kept its words raised (rewritten between two of the daemon's passes) had its raise
    written, and held from then on, by the admin's next change of anything, here its memory."""
    store = PodStore(tmp_path / "base")
    try:
        store.create("default", "tenant", {SIM_GPU0: GpuLimits(memory=2 * GiB, compute=3000)})
        with open_region(regions.region_path(store.base, "default", "tenant")) as region:
            uuid = region.devices[0].uuid
            region.set_limits(uuid, 64 * GiB, 9999, compute_soft_limit=COMPUTE_UNLIMITED)
            record = store.update("default", "tenant", {uuid: GpuLimits.change(memory=4 * GiB)})
            assert [gpu.limits for gpu in record.devices] == [DeviceLimits(4 * GiB, 3000, 0, 0)]
            store.hold_limits([record])  # a pass: nothing raised to set back
            assert region.devices[0].limits == DeviceLimits(4 * GiB, 3000, 0, 0)
            # Words the tenant lowered are its own, and a change of another limit keeps them.
            region.set_limits(uuid, 4 * GiB, 1000)
            record = store.update("default", "tenant", {uuid: GpuLimits.change(memory=3 * GiB)})
            assert [gpu.limits for gpu in record.devices] == [DeviceLimits(3 * GiB, 1000, 0, 0)]
            # A change refused over the held limits is refused over raised words too.
            region.set_limits(uuid, 0, 9999)
            with pytest.raises(PodError, match="oversubscri"):
                store.update(
                    "default", "tenant", {uuid: GpuLimits.change(memory=None, oversubscribe=True)}
                )
    finally:
        store.close()


# With the daemon


def test_a_compute_limit_a_tenant_raises_in_its_region_takes_nothing_from_others(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"]
) -> None:
    """Before, the daemon divided a contended GPU by the compute limit words in each region: a
    tenant that wrote 99.99 % into its own took 70 % of a GPU shared with a 40 % pod (which got
    28 %), launching nothing. Its memory limit raised the same way (64 GiB under the admin's
    4 GiB) stood: nothing set it back."""
    for name in ("honest", "greedy"):
        created = daemon.cli("pods", "create", name, "--compute", "0=60", "--mem", "0=4GiB")
        assert created.returncode == 0, created.stderr
    _busy(daemon, workloads, "honest", "greedy")
    regions = {n: open_region(daemon.base / "default" / n / "shm") for n in ("honest", "greedy")}
    try:
        wait_for(lambda: regions["greedy"].effective(0) == 4900, timeout=10)
        uuid = regions["greedy"].devices[0].uuid
        regions["greedy"].set_limits(uuid, 64 * GiB, 9999, compute_soft_limit=COMPUTE_UNLIMITED)
        wait_for(lambda: regions["greedy"].devices[0].compute_limit == 6000, timeout=10)
        limits = regions["greedy"].devices[0].limits
        assert limits == DeviceLimits(4 * GiB, 6000, 0, 0)
        time.sleep(1.5)  # a few passes
        assert regions["greedy"].effective(0) == regions["honest"].effective(0) == 4900
        shown = json.loads(daemon.cli("pods", "get", "greedy", "--json").stdout)
        assert [gpu["memory_limit"] for gpu in shown["gpus"]] == [4 * GiB]
        assert [gpu["compute_limit"] for gpu in shown["gpus"]] == [60]
        # Lowered, the pod's own words stand, and weigh as they are: 30 + 60 fit.
        regions["greedy"].set_limits(uuid, 2 * GiB, 3000)
        wait_for(lambda: regions["honest"].effective(0) == 6000, timeout=10)
        assert regions["greedy"].devices[0].limits == DeviceLimits(2 * GiB, 3000, 0, 0)
        # The admin's change through the API is held.
        assert daemon.cli("pods", "update", "greedy", "--compute", "0=80").returncode == 0
        wait_for(lambda: regions["honest"].effective(0) < 6000, timeout=10)
        assert regions["greedy"].devices[0].compute_limit == 8000
    finally:
        for region in regions.values():
            region.close()


def test_limits_raised_while_the_daemon_was_down_are_set_back(daemon: Daemon) -> None:
    created = daemon.cli("pods", "create", "tenant", "--compute", "0=60", "--mem", "0=2GiB")
    assert created.returncode == 0, created.stderr
    path = daemon.base / "default" / "tenant" / "shm"
    assert daemon.stop() == 0
    with open_region(path) as region:
        region.set_limits(region.devices[0].uuid, 64 * GiB, 9999)
    daemon.start()
    with open_region(path) as region:
        wait_for(lambda: region.devices[0].compute_limit == 6000, timeout=10)
        assert region.devices[0].memory_limit == 2 * GiB
    assert (daemon.base / ".daemon" / "limits.json").stat().st_mode & 0o777 == 0o600


def test_an_entry_a_pod_adds_for_a_gpu_it_was_not_given_takes_nothing_from_others(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"]
) -> None:
    """Before, the daemon weighed every entry of a region: a pod made for GPU 1 that wrote an
    entry of 99.99 % for GPU 0 into its own region, and ran there, held a 60 % pod on GPU 0 to
    37 %. The daemon made the pod's entries and holds them: one it did not make is neither
    weighed nor shown (a second entry of one GPU neither)."""
    for name, gpu in (("honest", 0), ("greedy", 1)):
        created = daemon.cli("pods", "create", name, "--compute", f"{gpu}=60")
        assert created.returncode == 0, created.stderr
    _busy(daemon, workloads, "honest")
    honest = open_region(daemon.base / "default" / "honest" / "shm")
    greedy = open_region(daemon.base / "default" / "greedy" / "shm")
    try:
        wait_for(lambda: honest.effective(0) == 6000, timeout=10)
        greedy.add_device(honest.devices[0].uuid, compute_limit=9999)
        workloads.append(daemon.workload("greedy", "--duration", "60", "--kernel-us", "500"))
        time.sleep(2.0)  # passes that saw the entry's GPU time grow
        assert honest.effective(0) == 6000
        shown = json.loads(daemon.cli("pods", "get", "greedy", "--json").stdout)
        assert [gpu["index"] for gpu in shown["gpus"]] == [1]
        log = daemon.log_file.read_text()
        assert log.count("is not one the daemon made") == 1, log
    finally:
        honest.close()
        greedy.close()
